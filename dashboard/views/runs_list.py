"""The runs list (filters in the query string, keyset pages, more rows by htmx) and its bulk actions:
a preview of what an action would touch, then the action on exactly the runs previewed."""

import json

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from approvals.selectors.queue import approvals_pending_counted
from dashboard import bulk, listing, presence
from runs.models import Run
from runs.selectors import runs_list
from tenancy import access


@login_required
@require_GET
@vary_on_headers("HX-Request")
def run_list(request):
    # Announce the viewer, then read the numbers, then the data (dashboard/live.py says why).
    presence.watching(presence.LIST_PRESENCE)
    visible = access.project_ids(request.user, "view")
    seqs_json = json.dumps(presence.list_seqs(visible))
    choices = runs_list.filter_choices(visible=visible)
    filters = listing.filters_parse(request.GET, **choices)
    page = runs_list.runs_for_list(visible=visible, filters=filters, pending_approvals=approvals_pending_counted())
    rows = list(page)
    runs = listing.rows_prepare(rows[: runs_list.PAGE_SIZE])
    context = {
        "runs": runs,
        "filters": filters,
        "next_query": filters.querystring(after=runs[-1].id) if len(rows) > runs_list.PAGE_SIZE else "",
        "statuses": Run.Status.choices,
        "bulk_actions": bulk.ACTIONS.items(),
        **choices,
    }
    context["seqs_json"] = seqs_json
    context["accept_new"] = not filters.active and not filters.after
    if request.GET.get("live"):  # a live re-render after a gap or a reconnect
        return render(request, "runs/list.html#run-rows", context)
    if request.htmx and not request.htmx.boosted:  # "Next page": its rows, and the pager out of band
        return render(request, "runs/list.html#page-rows", {**context, "oob": True})
    return render(request, "runs/list.html", context)


def _ids(values: list[str]) -> list[int]:
    """Run ids from form values, each of which may hold several, comma-separated."""
    ids = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            if not part.isdigit() or len(part) > 18:
                raise bulk.Refused(f"“{part[:40]}” is not a run id")
            if int(part) not in ids:
                ids.append(int(part))
    return ids


def _selection(request) -> tuple[list[int], str]:
    """The runs a preview is about: the ticked ones, or every run matching the list's filter (never only
    the page shown). Raises bulk.Refused when the selection cannot be used."""
    visible = access.project_ids(request.user, "view")
    if request.POST.get("scope") == "ticked":
        ids = _ids(request.POST.getlist("ids"))
        if len(ids) > bulk.MAX_RUNS:
            raise bulk.Refused(f"{len(ids)} runs are ticked; a bulk action acts on at most {bulk.MAX_RUNS}")
        ticked = runs_list.runs_filtered(visible=visible, filters=runs_list.RunFilters()).filter(id__in=ids)
        return list(ticked.values_list("id", flat=True)), "the ticked runs"
    filters = listing.filters_parse(request.POST, **runs_list.filter_choices(visible=visible))
    filters.after = None
    if filters.errors:  # ignoring a bad filter, as the list does, would widen what the action touches
        raise bulk.Refused(" ".join(filters.errors))
    matching = runs_list.runs_filtered(visible=visible, filters=filters)
    ids = list(matching.values_list("id", flat=True)[: bulk.MAX_RUNS + 1])
    if len(ids) > bulk.MAX_RUNS:
        raise bulk.Refused(
            f"more than {bulk.MAX_RUNS} runs match this filter; narrow it (by status, workflow or dates) and try again"
        )
    return ids, (f"every run matching the filter ({filters.describe()})" if filters.active else "every run you can see")


@login_required
@require_POST
def run_bulk(request):
    """Without ``confirm``: the preview, whose form carries the exact ids previewed. With ``confirm=1``:
    the action on those ids, each authorized and audited on its own, and a page of what happened."""
    action = request.POST.get("action", "")
    context = {
        "action": action,
        "label": bulk.ACTIONS.get(action, ""),
        "reason": request.POST.get("reason", "").strip()[:1000],
        "back": request.POST.get("back", "")[:2000],
        "scope": request.POST.get("scope_label", "the previewed runs")[:500],
    }
    status = 200
    try:
        if action not in bulk.ACTIONS:
            raise bulk.Refused("choose an action: cancel, retry failed tasks or compensate")
        if request.POST.get("confirm") == "1":
            ids = _ids(request.POST.getlist("run_ids"))
            if not ids:
                raise bulk.Refused("there are no previewed runs to act on; preview the action again")
            if context["reason"]:
                outcomes = bulk.bulk_apply(
                    user=request.user, action=action, run_ids=ids, reason=context["reason"], request=request
                )
                counts = {kind: sum(1 for o in outcomes if o.result == kind) for kind in ("done", "skipped", "failed")}
                return render(request, "runs/bulk.html", {**context, "outcomes": outcomes, "counts": counts})
            context["error"] = "Give a reason: it is recorded with each run in the audit log."
            status = 400
        else:
            ids, context["scope"] = _selection(request)
            context["back"] = listing.filters_parse(request.POST).querystring()
            if not ids:
                raise bulk.Refused("no run is selected: tick some runs, or preview for the filter")
        context["preview"] = bulk.bulk_preview(user=request.user, action=action, run_ids=ids)
    except bulk.Refused as exc:
        context["error"] = f"Nothing was done: {exc}."
        status = 400
    return render(request, "runs/bulk.html", context, status=status)
