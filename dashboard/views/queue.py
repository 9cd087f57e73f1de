"""The reviewer queue: pending requests of my projects, oldest first, decided in place.

Decisions are plain POSTs with CSRF and the arguments hash the reviewer saw (never sent over a
websocket, never queued); new requests are fetched every few seconds and appended."""

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponseNotAllowed
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET

from approvals.governance import change_request_decide, change_request_refusal, change_requests_pending
from approvals.links import link_open
from approvals.plans import plan_outline
from approvals.selectors.queue import (
    approval_asked,
    approval_get,
    approval_operations,
    approvals_pending,
    change_request_get,
    change_request_project,
)
from approvals.services import approval_decide, decider_refusal, link_decide
from core.errors import Forbidden, InvalidInput, NotFound, WardenError
from policy.models import ApprovalRequest
from runs.services.plans import workers_started
from tenancy.access import authorize, project_ids, role_of
from tenancy.governance import change_request_withdraw
from tenancy.models import ChangeRequest
from tools.gate import Verdict, strictest

POLL_SECONDS = 3
LIMIT = 200  # change requests on one page: more than this is an incident


def _pending(user, after: int = 0):
    return approvals_pending(visible=project_ids(user, "view"), after=after)


def _deciding(user):
    """The projects where ``user`` may decide (None: all), looked up once per page, not per card."""
    return project_ids(user, "decide")


def _card(request: ApprovalRequest, deciding, user) -> dict:
    """What a reviewer needs to decide: the action, why the agent asked, what it touches."""
    ops = approval_operations(request)
    first = ops[0] if ops else None
    reason, trace = approval_asked(first) if first is not None else ("", [])
    blast = {}
    for op in ops:
        key = (op.tool, op.reversibility or "read")
        blast[key] = blast.get(key, 0) + 1
    may_decide = deciding is None or request.run.project_id in deciding
    # Why this user may not decide it, shown instead of the buttons: their role, or a rule that holds
    # although their role could (they started the run, admins only).
    if may_decide:
        refused = decider_refusal(request, run=request.run, user=user)
        refusal = str(refused) if refused is not None else ""
    else:
        refusal = f"your role in project {request.run.project.slug} does not decide approvals (reviewers and admins do)"
    verdict = strictest(Verdict.from_json(op.verdict) for op in ops) if ops else None
    plan = plan_outline(request.run, request.plan) if request.kind == ApprovalRequest.Kind.PLAN else None
    for op in ops:  # the arguments as a reviewer reads them: JSON, and what an edit changed
        op.arguments_pretty = _pretty(op.arguments)
        op.edits = _edits(op.original_arguments, op.arguments) if op.original_arguments else []
    return {
        "request": request,
        "operations": ops,
        "reason": reason,
        "trace": trace,
        "blast": sorted((tool, rev, n) for (tool, rev), n in blast.items()),
        "may_decide": may_decide and not refusal,
        "refusal": refusal,
        "verdict": verdict.summary() if verdict else "",
        "editable": (request.kind == "operation" and len(ops) == 1)
        or (plan is not None and request.status == "pending" and not workers_started(request.run)),
        "arguments_json": json.dumps(
            request.plan if plan is not None else (first.arguments if first else {}), indent=1
        ),
        "plan": plan,
    }


def _pretty(value) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _edits(before: dict, after: dict) -> list[tuple[str, str, str]]:
    """(field, before, after) for each argument an approve-with-edits changed, added or removed."""
    changed = []
    for name in sorted(set(before) | set(after)):
        if before.get(name, ...) != after.get(name, ...):
            old = _pretty(before[name]) if name in before else "(absent)"
            new = _pretty(after[name]) if name in after else "(removed)"
            changed.append((name, old, new))
    return changed


@login_required
@require_GET
def queue(request):
    deciding = _deciding(request.user)
    cards = [_card(r, deciding, request.user) for r in _pending(request.user)]
    changes = [_change_card(c, request.user) for c in change_requests_pending(request.user)[:LIMIT]]
    return render(request, "approvals/queue.html", {"cards": cards, "changes": changes, "poll_seconds": POLL_SECONDS})


def _change_card(change: ChangeRequest, user) -> dict:
    """A change request as the second admin reads it: each field now and as asked for."""
    names = sorted(set(change.before) | set(change.after))
    rows = [
        (name, _pretty(change.before.get(name, "")), _pretty(change.after.get(name, "(removed)"))) for name in names
    ]
    refused = change_request_refusal(change, user)
    refusal = str(refused) if refused is not None else ""
    own = change.requested_by_id == user.pk
    return {"change": change, "rows": rows, "may_decide": not refusal, "own": own, "refusal": "" if own else refusal}


@login_required
def change_decide(request, change_id: int):
    """Approve, reject or (its author) withdraw a change request: a CSRF-checked POST; the card again
    for htmx, a 303 back to the queue otherwise."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    error, decision = "", request.POST.get("decision", "")
    project_id = change_request_project(change_id)
    if project_id is None or role_of(request.user, project_id) is None:  # a stranger learns nothing of it
        return render(request, "approvals/_gone.html", {"error": "this change request does not exist"}, status=404)
    try:
        if decision == "withdraw":
            change_request_withdraw(request_id=change_id, user=request.user, request=request)
        elif decision in ("approve", "reject"):
            note = request.POST.get("note", "")
            change_request_decide(request_id=change_id, user=request.user, approve=decision == "approve", note=note,
                                  request=request)  # fmt: skip
        else:
            raise InvalidInput("decide with approve, reject or withdraw", [{"field": "decision", "message": "unknown"}])
    except NotFound as exc:
        return render(request, "approvals/_gone.html", {"error": str(exc)}, status=404)
    except WardenError as exc:
        error = str(exc) + "".join(f" — {e['field']}: {e['message']}" for e in getattr(exc, "errors", []) or [])
    change = change_request_get(change_id)
    if not request.htmx:
        if error:
            messages.error(request, error)
        return redirect(f"{reverse('approvals-queue')}#change-{change_id}", status=303)
    card = _change_card(change, request.user)
    context = {"change": card["change"], "change_rows": card["rows"], "may_decide": card["may_decide"],
               "own": card["own"], "refusal": card["refusal"], "error": error}  # fmt: skip
    return render(request, "approvals/_change.html", context, status=409 if error else 200)


@login_required
@require_GET
def queue_new(request):
    """Cards of requests newer than the newest one the page shows (polled)."""
    try:
        after = int(request.GET.get("after", 0))
    except ValueError:
        after = 0
    deciding = _deciding(request.user)
    cards = [_card(r, deciding, request.user) for r in _pending(request.user, after=after)]
    return render(request, "approvals/_cards.html", {"cards": cards})


@login_required
def decide(request, request_id: int):
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    approval = approval_get(request_id)
    error = ""
    try:
        if approval is None:
            raise NotFound("this request does not exist")
        authorize(
            request.user, approval.run.project_id, "decide", what=f"approval request {request_id}", request=request
        )
        edited = None
        if request.POST.get("arguments", "").strip() and request.POST.get("decision") == "edit":
            try:
                edited = json.loads(request.POST["arguments"])
            except json.JSONDecodeError as exc:
                raise WardenError(f"the edited arguments are not JSON: {exc}") from exc
            if not isinstance(edited, dict):
                raise WardenError("the edited arguments must be a JSON object")
        approval_decide(
            request_id=request_id,
            user=request.user,
            approve=request.POST.get("decision") in ("approve", "edit"),
            note=request.POST.get("note", ""),
            seen_hash=request.POST.get("arguments_hash", ""),
            edited_arguments=edited,
            request=request,
        )
    except NotFound as exc:
        # Someone outside the request's project learns nothing of it, not even that it exists.
        return render(request, "approvals/_gone.html", {"error": str(exc)}, status=404)
    except WardenError as exc:
        error = str(exc)
        for detail in getattr(exc, "errors", []) or []:
            error += f" — {detail['field']}: {detail['message']}"
    approval.refresh_from_db()
    context = {"card": _card(approval, _deciding(request.user), request.user), "error": error}
    return render(request, "approvals/_card.html", context)


@login_required
def decision_link_page(request, token: str):
    """A signed one-time link from a notification (approvals/links.py): GET shows the card, POST decides
    once. Whoever opens it still needs a login that may decide the request."""
    if request.method not in ("GET", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    try:
        # Access first: someone outside the project gets the same 404 whatever state the link is in.
        approval = link_open(token, user=request.user, request=request).request
        if request.method == "POST":
            approval = link_decide(
                token=token,
                user=request.user,
                approve=request.POST.get("decision") == "approve",
                note=request.POST.get("note", ""),
                request=request,
            )
            return render(request, "approvals/link.html", {"card": _card(approval, None, request.user)})
    except NotFound as exc:
        return render(request, "approvals/_gone.html", {"error": str(exc)}, status=404)
    except Forbidden as exc:
        return render(request, "approvals/link.html", {"error": str(exc)}, status=403)
    except WardenError as exc:  # spent, decided, expired; or a refused decision (a rejection without comment)
        return render(request, "approvals/link.html", {"error": str(exc)}, status=409)
    card = _card(approval, _deciding(request.user), request.user)
    return render(request, "approvals/link.html", {"card": card, "via_link": token})
