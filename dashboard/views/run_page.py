"""The run page: header and budgets, live trace tree, timeline, ledger, attribution and artifacts.

The view checks access, asks runs.selectors.run_page for the rows (a fixed handful of queries whatever the
run's size: spans as light rows, payloads on demand) and draws them (dashboard/trace.py).
``run_push`` renders what changed since the last push, for dashboard.live to send to the run's viewers.
"""

import json

from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.http import Http404, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html_join
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_GET

from agents.models import Workflow
from dashboard import presence
from dashboard.trace import (
    FULL_TREE_MAX,
    ONLY_CHOICES,
    TASKS_DRAWN,
    critical_path,
    esc,
    money,
    more_tasks_html,
    node_html,
    node_row,
    operation_flags,
    timeline_svg,
    totals_apply,
    tree_build,
    tree_filter,
    tree_html,
)
from replay.services import SETTLED as REPLAYABLE
from runs.models import Run, Span
from runs.refusals import run_cancel_refusal, run_fork_state_refusal, run_resume_refusal
from runs.selectors import run_page as selectors
from runs.selectors.trace import CONTAINERS, orphan_ids, span_rows, task_totals
from saga.compensation import COMPENSABLE_FROM, compensation_unresolved, run_compensate_refusal
from tools.gate import Verdict
from tools.models import ToolOperation

from .common import run_for_view
from .evals import reviews_context

PREVIEW_CHARS = 4000
EXTERNAL = Workflow.Planner.EXTERNAL
ARTIFACTS_SHOWN = 100  # the newest; the admin lists them all
OPS_SHOWN = 300  # the newest ledger rows of a large run; the API and the admin list them all
TEMPLATE = "runs/run.html"


# --- what the page shows -----------------------------------------------------------------------------------
def _timeline_tasks(run_id: int, now) -> tuple[list, list[int], list[int]]:
    """The tasks the timeline draws, the critical path, and the ids of every task in plan order. A
    large run draws its first TASKS_DRAWN tasks and those of the critical path, which is found over
    light rows of every task (the same two queries for 10 tasks or 10,000)."""
    light = selectors.run_task_times(run_id)
    critical = critical_path(light, now.timestamp())
    drawn = {t.id for t in light[:TASKS_DRAWN]} | set(critical)
    return list(selectors.run_tasks(run_id, ids=drawn)), critical, [t.id for t in light]


def _attribution(run: Run) -> list[dict]:
    total = max(run.cost_micros, 1)
    return [
        {
            "agent": agent,
            "tasks": tasks,
            "tokens": tokens,
            "share": round(100 * cost / total),
            "cost_label": money(cost),
        }
        for agent, tasks, tokens, cost in selectors.run_attribution(run.id)
    ]


# --- what the page shows -----------------------------------------------------------------------------------
def _undo(op: ToolOperation) -> str:
    plan = op.compensation or {}
    if op.tool_class == "read_only":
        return "nothing (a read)"
    if op.kind != "action":
        return f"({op.kind} of operation {op.compensates_id})"
    agent = ", by the agent" if plan.get("by") == "the agent" else ""  # an external run's own tool
    if op.reversibility == "reversible" and plan.get("tool"):
        return f"undo with {plan['tool']}{agent}"
    if plan.get("tool"):
        return f"correction with {plan['tool']}{agent} (a reviewer approves first)"
    return "cannot be undone"


def ledger_row_html(op: ToolOperation, run_id: int) -> str:
    """One ledger row. A plain string, like the tree's nodes: a run may have a thousand operations.
    Every text is escaped; the status reason (it may quote a tool's error) sits in hx-disable."""
    where = f"{esc(op.task.key)} · {int(op.step or 0)}" if op.task_id else "run"
    reason = f'<div class="reason" hx-disable>{esc(op.status_reason[:140])}</div>' if op.status_reason else ""
    # The gate's verdict: in short, and whole (its reasons, policies and allow rule) on hover.
    verdict = Verdict.from_json(op.verdict)
    head = verdict.summary().split(" — ")[0]
    decided = f" · {esc(op.approval.status)}" if op.approval_id else ""
    approval = f'<span class="verdict" title="{esc(verdict.summary())}">{esc(head)}</span>{decided}'
    resolve = ""
    if op.status == "ambiguous":
        url = esc(reverse("runs:operation-resolve", args=[run_id, op.id]))
        resolve = f'<a href="{url}">Resolve…</a>'
    status, rev = esc(op.status), esc(op.reversibility)
    return (
        f'<tr id="op-{op.id}" data-parent="ledger-rows" class="s-{status}"><td>{op.id}</td><td>{where}</td>'
        f'<td>{esc(op.tool)}</td><td class="key">{esc(op.idempotency_key)}</td>'
        f'<td><span class="badge s-{status}">{status}</span>{reason}</td><td>{esc(op.tool_class)}</td>'
        f'<td class="{rev}">{rev or "—"}</td><td>{approval}</td><td>{esc(_undo(op))}</td><td>{resolve}</td></tr>'
    )


def cost_multiple(run: Run, usage: dict) -> tuple[float | None, int | None]:
    """The run's cost over an estimate of one agent doing the same work: it writes every output once
    and reads one context as large as the largest prompt, instead of each worker re-reading its own.
    A rough yardstick (docs/dashboard.md): a multiple well above the speedup says the fan-out did not pay."""
    out, biggest, cost = usage.get("out") or 0, usage.get("biggest_in") or 0, usage.get("cost") or 0
    tokens = out + (usage.get("tokens_in") or 0)
    if not tokens or not cost:
        return None, None
    estimate = int((out + biggest) * cost / tokens)
    return (run.cost_micros / estimate if estimate else None), estimate


def _budgets(run: Run) -> list[dict]:
    rows = [
        ("steps", run.steps_used, run.max_steps, str),
        ("tokens", run.tokens_used, run.max_tokens, str),
        ("tool calls", run.tool_calls_used, run.max_tool_calls, str),
        ("cost", run.cost_micros, run.max_cost_micros, money),
    ]
    return [
        {
            "name": name,
            "used": used,
            "limit": limit,
            "high": int(limit * 0.8) if limit else None,
            "label": f"{fmt(used)} of {fmt(limit)}" if limit is not None else f"{fmt(used)} (no limit)",
        }
        for name, used, limit, fmt in rows
    ]


def header_context(run: Run, now, summary: dict | None = None) -> dict:
    """The header's figures, summed by the database: the same few queries for 5 tasks or 1,000."""
    summary = summary or selectors.run_summary(run.id, now)
    multiple, estimate = cost_multiple(run, summary)
    end = run.finished_at or now
    wall = (end - run.started_at).total_seconds() if run.started_at else 0
    busy = float(summary["busy"] or 0)
    speedup = busy / wall if busy and wall > 0 else None
    failed = selectors.run_failed_tasks(run)
    names = getattr(run, "names", None) or (
        run.workflow.name,
        run.project.slug,
        run.started_by.get_username() if run.started_by_id else "",
    )
    return {
        "run": run,
        "versions": _versions_line(run.versions),
        "workflow_name": names[0],
        "project_slug": names[1],
        "starter": names[2],
        "tasks_total": summary["tasks"],
        "tasks_done": summary["done"],
        "failed_tasks": failed,
        # Requests as the reviewer queue counts them: a bundle of five e-mails is one request.
        "pending_approvals": summary["pending"],
        "ambiguous": summary["ambiguous"],
        "budgets": _budgets(run),
        "cost": money(run.cost_micros),
        "speedup": f"{speedup:.2f}×" if speedup else "—",
        "multiple": f"{multiple:.2f}×" if multiple else "—",
        "estimate": money(estimate) if estimate else "—",
        "stored": int(summary["stored"] or 0),  # bytes of span bodies, payloads and artifacts
        # The buttons offered are the services' own rules (runs/refusals.py, saga/compensation.py).
        "can_cancel": run_cancel_refusal(run) is None,
        "can_resume": run_resume_refusal(run) is None,
        # By the run's status alone (no query per push): the fork page gives the whole refusal, if any.
        "can_fork": run_fork_state_refusal(run) is None,
        # A settled live run of a workflow Warden runs itself: what-if replays (docs/replay.md).
        "can_replay": run.mode == Run.Mode.LIVE and run.status in REPLAYABLE and run.workflow.planner != EXTERNAL,
        **_compensate_offer(run),
    }


def _compensate_offer(run: Run) -> dict:
    """The Compensate button, or (for a stopped run something still holds up) why it is not offered."""
    if run.status not in COMPENSABLE_FROM:  # most runs: no query
        refused = run_compensate_refusal(run, running=[], unresolved=[])
        return {"can_compensate": refused is None, "compensate_refusal": ""}
    running = selectors.run_running_task_keys(run.id)
    refused = run_compensate_refusal(run, running=running, unresolved=compensation_unresolved(run.id))
    return {"can_compensate": refused is None, "compensate_refusal": str(refused or "")}


def _page_tree(run: Run, rows, summary: dict, ops, ops_total: int, first, tasks_total: int):
    """The tree's roots and nodes with their totals, and the item that loads a large run's next tasks."""
    if ops_total > len(ops):  # the tree's marks come from every operation of the steps it draws
        flags = selectors.run_step_flags(
            run.id, sorted({r["task_id"] for r in rows if r["kind"] == "tool_call" and r["task_id"]})
        )
    else:
        flags = operation_flags(ops)
    roots, nodes = tree_build(rows, flags, orphan_ids(run))
    totals_apply(nodes, task_totals(run.id, first))  # a no-op when every span is loaded; same queries either way
    root_totals(run, nodes, summary)
    if first and len(first) < tasks_total:
        for root in roots:
            if root.kind == Span.Kind.RUN:
                root.more = more_tasks_html(run.id, root.id, after=first[-1], remaining=tasks_total - len(first))
    return roots, nodes


def run_context(run: Run, *, q: str = "", only: str = "") -> dict:
    # The number first, then the data: a push numbered up to this one was rendered before these reads.
    seq = presence.seq_current(presence.run_seq_name(run.id))
    now = timezone.now()
    only = only if only in ONLY_CHOICES else ""
    summary = selectors.run_summary(run.id, now)
    total = summary["spans"]
    tasks, critical, task_ids = _timeline_tasks(run.id, now)
    tasks_total = len(task_ids)
    # A run of many tasks draws the first TASKS_DRAWN; the tree loads the next ones when asked.
    first = task_ids[:TASKS_DRAWN] if not (q.strip() or only) else None
    rows = selectors.run_page_spans(run, first=first, whole=total <= FULL_TREE_MAX or bool(q.strip() or only))
    ops, ops_total = selectors.run_ledger(run.id, shown=OPS_SHOWN)
    roots, nodes = _page_tree(run, rows, summary, ops, ops_total, first, tasks_total)
    keep = tree_filter(nodes, q=q, only=only)
    by_id = {t.id: t for t in tasks}
    artifacts, artifacts_total = selectors.run_artifacts(run.id, shown=ARTIFACTS_SHOWN)
    blackboard, blackboard_total = selectors.run_blackboard(run.id, shown=ARTIFACTS_SHOWN)
    return {
        **header_context(run, now, summary),
        "tree": tree_html(roots, run.id, total=total, keep=keep),
        "span_count": total,
        "filtered": keep is not None,
        "matches": len(keep) if keep is not None else None,
        "q": q,
        "only": only,
        "only_choices": ONLY_CHOICES.items(),
        "timeline": timeline_svg(tasks, [r for r in rows if r["kind"] == "attempt"], run, set(critical), now),
        "critical": [by_id[i].key for i in critical],
        "ledger": mark_safe("".join(ledger_row_html(op, run.id) for op in ops)),
        "ledger_total": ops_total,
        "ledger_shown": len(ops),
        "timeline_total": tasks_total,
        "timeline_drawn": len(tasks),
        "attribution": _attribution(run),
        "artifacts": artifacts,
        "artifacts_total": artifacts_total,
        "blackboard": blackboard,
        "blackboard_total": blackboard_total,
        "seq": seq,
    }


def _params(request) -> tuple[str, str]:
    return request.GET.get("q", "")[:200], request.GET.get("only", "")


# --- pages and fragments -----------------------------------------------------------------------------------
@login_required
@require_GET
def run_detail(request, run_id: int):
    run = run_for_view(request, run_id)
    # Announce the viewer before reading: a change committed from now on is pushed to this page.
    presence.watching(presence.run_presence(run.id))
    q, only = _params(request)
    return render(request, TEMPLATE, {**run_context(run, q=q, only=only), **reviews_context(request, run)})


@login_required
@require_GET
def run_live(request, run_id: int):
    """Everything that moves on the page, re-rendered from the database (after a gap or a reconnect)."""
    run = run_for_view(request, run_id)
    presence.watching(presence.run_presence(run.id))
    q, only = _params(request)
    return render(request, TEMPLATE + "#run-live", run_context(run, q=q, only=only))


@login_required
@require_GET
def run_timeline(request, run_id: int):
    run = run_for_view(request, run_id)
    now = timezone.now()
    tasks, critical, task_ids = _timeline_tasks(run.id, now)
    tasks_total = len(task_ids)
    attempts = span_rows(run.id, kind=Span.Kind.ATTEMPT, task_id__in=[t.id for t in tasks])
    by_id = {t.id: t for t in tasks}
    context = {
        "run": run,
        "timeline_total": tasks_total,
        "timeline_drawn": len(tasks),
        "timeline": timeline_svg(tasks, attempts, run, set(critical), now),
        "critical": [by_id[i].key for i in critical],
        "speedup": header_context(run, now)["speedup"],
    }
    return render(request, TEMPLATE + "#timeline", context)


@login_required
@require_GET
def span_children(request, run_id: int, span_id: int):
    """The spans below one node, for a subtree opened on demand (a whole page without htmx)."""
    run = run_for_view(request, run_id)
    root = selectors.span_row(run.id, span_id)
    if root is None:
        raise Http404("no such span in this run")
    if "after" in request.GET and root["kind"] == Span.Kind.RUN:
        return _more_tasks(request, run, root)
    rows = span_rows(run.id, task_id=root["task_id"]) if root["task_id"] else span_rows(run.id)
    _, nodes = tree_build(rows, operation_flags(selectors.run_operations(run.id)), orphan_ids(run))
    node = nodes[span_id]
    now = timezone.now()
    kids = format_html_join("", "{}", ((node_html(c, run.id, now, mode="lazy"),) for c in node.children))
    if request.htmx:
        return HttpResponse(kids)
    return render(request, "runs/subtree.html", {"run": run, "node": node_html(node, run.id, now, mode="full")})


def _more_tasks(request, run: Run, root: dict):
    """A large run's next TASKS_DRAWN task nodes (closed), and the item that loads those after them."""
    try:
        after = int(request.GET["after"])
    except ValueError:
        return HttpResponseBadRequest("after: a task id")
    ids = selectors.run_task_ids_page(run.id, after=after, count=TASKS_DRAWN)
    rows = selectors.run_container_spans(run.id, ids)
    roots, nodes = tree_build(rows, selectors.run_step_flags(run.id, ids))
    totals_apply(nodes, task_totals(run.id, ids))
    now = timezone.now()
    html = "".join(node_html(n, run.id, now, mode="closed") for n in roots if n.kind == Span.Kind.TASK)
    remaining = selectors.run_tasks_after(run.id, ids[-1]) if ids else 0
    if remaining:
        html += more_tasks_html(run.id, root["id"], after=ids[-1], remaining=remaining)
    if request.htmx:
        return HttpResponse(html)
    return render(request, "runs/subtree.html", {"run": run, "node": mark_safe(html)})  # without htmx


@login_required
@require_GET
def span_payload(request, run_id: int, span_id: int):
    """A span's journaled body: a truncated preview (htmx), or the whole of it as a JSON download."""
    run = run_for_view(request, run_id)
    span = selectors.span_with_payload(run.id, span_id)
    if span is None:
        raise Http404("no such span in this run")
    body = span.payload.body if span.payload_id else span.body
    if span.kind == Span.Kind.RECOVERY or body is None:
        body = {"attributes": span.attributes, "body": body}
    if request.GET.get("preview"):
        text = json.dumps(body, indent=1, default=str)
        return render(
            request,
            "runs/run.html#payload-preview",
            {
                "text": text[:PREVIEW_CHARS],
                "truncated": len(text) > PREVIEW_CHARS,
                "size": len(text),
                "url": request.path,
            },
        )
    response = JsonResponse(body, safe=False, json_dumps_params={"indent": 1, "default": str})
    response["Content-Disposition"] = f'attachment; filename="run-{run.id}-span-{span.id}.json"'
    return response


@login_required
@require_GET
def artifact_download(request, run_id: int, artifact_id: int):
    run = run_for_view(request, run_id)
    artifact = selectors.artifact_of_run(run.id, artifact_id)
    if artifact is None:
        raise Http404("no such artifact in this run")
    document = {
        "key": artifact.key,
        "version": artifact.version,
        "verification": artifact.verification,
        "provenance": artifact.provenance,
        "schema": artifact.schema,
        "content": artifact.content,
    }
    response = JsonResponse(document, json_dumps_params={"indent": 1, "default": str})
    response["Content-Disposition"] = f'attachment; filename="run-{run.id}-{artifact.key}-v{artifact.version}.json"'
    return response


# --- live pushes -------------------------------------------------------------------------------------------
MARK_SECONDS = 3600


def mark_forget(run_id: int) -> None:
    """Nobody watches: the next viewer starts from the database, not from a stale watermark."""
    cache.delete(_mark_key(run_id))


def _mark_key(run_id: int) -> str:
    return f"mark:run:{run_id}"


def _subtree_totals(run: Run, nodes: dict, summary: dict) -> None:
    """Totals of the pushed ancestors, which the push loaded without their other children: a task's
    from all its spans, an attempt's from its children, the run's from its usage."""
    attempts = [n.id for n in nodes.values() if n.kind == Span.Kind.ATTEMPT]
    tasks = sorted({n.task_id for n in nodes.values() if n.kind in CONTAINERS and n.task_id})
    if tasks:
        groups = [("task_id", tasks)] + ([("parent_id", attempts)] if attempts else [])
        for column, ids in groups:
            totals = selectors.span_sums(run.id, column=column, task_ids=tasks, ids=ids)
            for node in nodes.values():
                key = node.task_id if column == "task_id" else node.id
                if (node.kind == Span.Kind.TASK) == (column == "task_id") and node.kind in CONTAINERS and key in totals:
                    tokens, cost, count, errors = totals[key]
                    if column == "parent_id":  # the children's sums, plus the attempt itself
                        tokens, cost, count = tokens + node.tokens, cost + node.cost_micros, count + 1
                        errors += node.status == Span.Status.ERROR
                    node.sub_tokens, node.sub_cost, node.sub_count, node.sub_errors = tokens, cost, count, errors
    _inner_totals(run.id, nodes)
    root_totals(run, nodes, summary)


def _inner_totals(run_id: int, nodes: dict) -> None:
    """Σ of the pushed spans with children that are not containers (an ingested OTLP tree is deeper than
    run, task, attempt, call): summed by the database over the whole subtree, as the push loaded only the
    path to what changed. No query for a run of Warden's own workers."""
    inner = [n.id for n in nodes.values() if n.kind not in CONTAINERS and n.children]
    if not inner:
        return
    for root, (tokens, cost, count, errors) in selectors.span_subtree_sums(run_id, inner).items():
        node = nodes[root]
        node.sub_tokens, node.sub_cost, node.sub_count, node.sub_errors = tokens, cost, count, errors


def root_totals(run: Run, nodes: dict, summary: dict) -> None:
    """The run node's totals from the run's own counters (page and push alike)."""
    for node in nodes.values():
        if node.kind == Span.Kind.RUN:
            node.sub_tokens, node.sub_cost = run.tokens_used, run.cost_micros
            node.sub_count, node.sub_errors = summary["spans"], summary["errors"]


def _versions_line(versions) -> str:
    """What the run started with, in one line: "workflow v2 · agents: planner v1, worker v3 · 2 policies"."""
    if not isinstance(versions, dict) or not versions:
        return ""
    parts = []
    if versions.get("workflow"):
        parts.append(f"workflow v{versions['workflow'].get('version')}")
    agents = versions.get("agents") or {}
    if agents:
        parts.append("agents: " + ", ".join(f"{slug} v{ref.get('version')}" for slug, ref in sorted(agents.items())))
    policies = versions.get("policies") or []
    parts.append(f"{len(policies)} approval {'policy' if len(policies) == 1 else 'policies'} in force")
    return " · ".join(parts)


def _changed_rows(changed: list[dict], nodes: dict, run_id: int, now, *, new_after: int) -> list:
    """A new span as a lazy subtree, a changed one as its row, and each ancestor's row once (its totals)."""
    parts = []
    rows_done: set[int] = set()
    for span in changed:
        node = nodes.get(span["id"])
        if node is None:
            continue
        if span["id"] > new_after:
            parts.append(node_html(node, run_id, now, mode="lazy"))
        else:
            parts.append(node_row(node, now))
        rows_done.add(node.id)
        parent = nodes.get(node.parent_id) if node.parent_id else None
        while parent is not None:  # subtree totals moved all the way up
            if parent.id not in rows_done:
                parts.append(node_row(parent, now))
                rows_done.add(parent.id)
            parent = nodes.get(parent.parent_id) if parent.parent_id else None
    return parts


def run_push(run_id: int) -> dict | None:
    """What changed in the run since the last push, as HTML fragments with stable ids (no payloads).

    The watermark (last span id, spans still open, operation statuses, last artifact) lives in the
    shared cache. Without one — the first push to a new viewer, an evicted key — the browsers are told
    to re-render from the database instead."""
    run = selectors.run_for_push(run_id)
    if run is None:
        return None
    now = timezone.now()
    mark = cache.get(_mark_key(run_id))
    summary = selectors.run_summary(run_id, now)
    statuses = selectors.run_operation_statuses(run_id)
    # Open spans, and spans attached to a parent that arrived after them (OTLP ingest): a push only adds
    # and updates nodes, so a span that moved under a new parent sends the browsers to the database.
    moving = selectors.run_spans_moving(run_id)
    open_now, moved = moving.open, moving.moved
    last_span, last_artifact = summary["last_span"] or 0, summary["last_artifact"] or 0
    new_mark = {"span": last_span, "open": open_now, "ops": statuses, "art": last_artifact, "moved": moved}
    cache.set(_mark_key(run_id), new_mark, timeout=MARK_SECONDS)
    if mark is None or moved != mark.get("moved", moved):
        return {"refetch": True}

    changed = selectors.run_spans_changed(run_id, last=last_span, since=mark["span"], was_open=mark["open"])
    task_ids = sorted({s["task_id"] for s in changed if s["task_id"]})
    changed_ops = [i for i, status in statuses.items() if mark["ops"].get(i) != status]
    rows = selectors.spans_with_ancestors(run_id, [s["id"] for s in changed])
    flags = selectors.run_step_flags(run_id, task_ids)
    _, nodes = tree_build([rows[i] for i in sorted(rows)], flags)
    _subtree_totals(run, nodes, summary)
    parts = [render_to_string(TEMPLATE + "#run-header", header_context(run, now, summary))]
    parts += _changed_rows(changed, nodes, run_id, now, new_after=mark["span"])
    if changed_ops:
        parts += [ledger_row_html(op, run_id) for op in selectors.run_operations(run_id, ids=changed_ops)]
    parts.append(render_to_string(TEMPLATE + "#attribution", {"attribution": _attribution(run)}))
    if last_artifact > mark["art"]:
        for artifact in selectors.run_artifacts_after(run_id, mark["art"]):
            parts.append(render_to_string(TEMPLATE + "#artifact", {"artifact": artifact, "run": run}))
    timeline = any(s["kind"] in (Span.Kind.TASK, Span.Kind.ATTEMPT) for s in changed)
    return {"html": "".join(parts), "timeline": timeline}
