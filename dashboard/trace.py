"""The run page's trace tree and timeline, built from light span rows in one pass.

Nodes and bars are rendered as plain strings rather than a template (or ``format_html``) per node: a
run page may draw a thousand task nodes and their bars, and those cost ten times as much. Every text
that came from a model, a tool or an operator goes through ``esc`` (the standard library's
``html.escape``, quotes included); numbers are formatted from ints and floats; names sit inside
``hx-disable`` so htmx never processes attributes found in them.
"""

from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from html import escape as esc

from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

from runs.models import Span
from runs.selectors.trace import CONTAINERS

FULL_TREE_MAX = 400  # spans: a run this small is drawn whole and open
# Tasks a page draws at once (tree and timeline); a larger run's tree loads the next ones on demand,
# so a run of 10,000 tasks costs its page what one of 300 does.
TASKS_DRAWN = 300
EAGER_SUBTREE_MAX = 150  # below a lazily loaded node, children this small come along

KIND_LABELS = {
    "run": "run",
    "task": "task",
    "attempt": "attempt",
    "model_call": "model",
    "tool_call": "tool",
    "approval_wait": "approval",
    "recovery": "recovery",
    "compensation": "compensation",
    "plan": "plan",
}
FLAG_LABELS = {"orphan": "parent not received"}
ONLY_CHOICES = {"failed": "failed", "approval": "awaiting approval", "irreversible": "irreversible",
                "refused": "refused by the tool"}  # fmt: skip


@dataclass
class Node:
    id: int
    parent_id: int | None
    task_id: int | None
    kind: str
    name: str
    status: str
    attempt: int | None
    step: int | None
    started_at: datetime
    ended_at: datetime | None
    tokens_in: int
    tokens_out: int
    cost_micros: int
    payload_id: int | None
    children: list["Node"] = field(default_factory=list)
    flags: set = field(default_factory=set)
    sub_tokens: int = 0
    sub_cost: int = 0
    sub_count: int = 1
    sub_errors: int = 0
    more: str = ""  # a "load the next tasks" item after the children drawn (a large run's root)

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out

    def duration_ms(self, now=None) -> float | None:
        end = self.ended_at or now
        return None if end is None else (end - self.started_at).total_seconds() * 1000


def operation_flags(operations) -> dict[tuple[int, int], set]:
    """Flags of tool-call spans from the ledger, keyed by (task, step): the ledger knows reversibility."""
    flags: dict[tuple[int, int], set] = {}
    for op in operations:
        if op.task_id is None or op.step is None:
            continue
        mine = flags.setdefault((op.task_id, op.step), set())
        if op.reversibility == "irreversible":
            mine.add("irreversible")
        if op.status in ("awaiting_approval", "proposed"):
            mine.add("approval")
        if op.status == "refused":  # the system said no; the model was told
            mine.add("refused")
    return flags


def tree_build(
    rows: list[dict], op_flags: dict | None = None, orphans: set[int] | frozenset = frozenset()
) -> tuple[list[Node], dict[int, Node]]:
    """Roots and an index of every node, with subtree totals (tokens, cost, spans, errors). ``orphans``:
    ingested spans whose parent was never received (they hang under their task's span)."""
    nodes = {row["id"]: Node(**row) for row in rows}
    roots = []
    for node in nodes.values():  # ids ascend, so children keep their order
        parent = nodes.get(node.parent_id) if node.parent_id else None
        (parent.children if parent else roots).append(node)
        if node.status == Span.Status.ERROR:
            node.flags.add("failed")
        if node.kind == Span.Kind.APPROVAL_WAIT and node.ended_at is None:
            node.flags.add("approval")
        if op_flags and node.kind == Span.Kind.TOOL_CALL and node.task_id and node.step:
            node.flags |= op_flags.get((node.task_id, node.step), set())
        if node.id in orphans:
            node.flags.add("orphan")
    # Children before parents, walked from the roots: an ingested span may be older (a lower id) than
    # the parent it was attached to later, so id order is not enough.
    order, stack = [], list(roots)
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(node.children)
    for node in reversed(order):
        node.sub_tokens += node.tokens
        node.sub_cost += node.cost_micros
        node.sub_errors += node.status == Span.Status.ERROR
        parent = nodes.get(node.parent_id) if node.parent_id else None
        if parent is not None:
            parent.sub_tokens += node.sub_tokens
            parent.sub_cost += node.sub_cost
            parent.sub_count += node.sub_count
            parent.sub_errors += node.sub_errors
    return roots, nodes


def totals_apply(nodes: dict[int, Node], totals: dict[int, tuple[int, int, int, int]]) -> None:
    """Give each task node its whole subtree's totals, and carry the difference up to the run."""
    for node in nodes.values():
        if node.kind != Span.Kind.TASK or node.task_id not in totals:
            continue
        tokens, cost, spans, errors = totals[node.task_id]
        delta = (tokens - node.sub_tokens, cost - node.sub_cost, spans - node.sub_count, errors - node.sub_errors)
        current = node
        while current is not None:
            current.sub_tokens += delta[0]
            current.sub_cost += delta[1]
            current.sub_count += delta[2]
            current.sub_errors += delta[3]
            current = nodes.get(current.parent_id) if current.parent_id else None


def tree_filter(nodes: dict[int, Node], *, q: str = "", only: str = "") -> set[int] | None:
    """Ids to show: the matching nodes and their ancestors (None: no filter)."""
    q = q.strip().lower()
    if not q and only not in ONLY_CHOICES:
        return None
    keep: set[int] = set()
    for node in nodes.values():
        if q and q not in node.name.lower() and q not in node.kind:
            continue
        if only and only not in node.flags:
            continue
        current = node
        while current is not None and current.id not in keep:
            keep.add(current.id)
            current = nodes.get(current.parent_id) if current.parent_id else None
    return keep


def f1(value: float) -> str:
    return f"{value:.1f}"


def money(micros: int) -> str:
    return f"${micros / 1_000_000:.4f}" if micros < 10_000_000 else f"${micros / 1_000_000:,.2f}"


def duration(ms: float | None) -> str:
    if ms is None:
        return "—"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 120_000:
        return f"{ms / 1000:.1f} s"
    if ms < 7_200_000:
        return f"{ms / 60_000:.1f} min"
    return f"{ms / 3_600_000:.1f} h"


def _status(node: Node) -> str:
    return node.status if node.ended_at or node.status != "ok" else "running"


def node_row(node: Node, now) -> SafeString:
    """The node's summary line: what a push replaces when the node changes."""
    parts = [
        f'<summary id="row-{node.id}" data-row><span class="kind">{esc(KIND_LABELS.get(node.kind, node.kind))}</span> '
        f'<span class="name" hx-disable>{esc(node.name)}</span> '
    ]
    if node.step:
        parts.append(f'<span class="step">step {int(node.step)}</span> ')
    status = esc(_status(node))
    parts.append(
        f'<span class="badge s-{status}">{status}</span> <span class="dur">{duration(node.duration_ms(now))}</span>'
    )
    if node.kind in ("model_call", "tool_call") or node.tokens:
        parts.append(
            f' <span class="tok">{int(node.tokens)} tok</span> <span class="cost">{money(node.cost_micros)}</span>'
        )
    if node.children or node.kind in ("run", "task", "attempt"):
        failed = f" · {int(node.sub_errors)} failed" if node.sub_errors else ""
        parts.append(
            f' <span class="sub" title="this node and everything below it">Σ {int(node.sub_tokens)} tok · '
            f"{money(node.sub_cost)} · {int(node.sub_count)} spans{failed}</span>"
        )
    for flag in sorted(node.flags):
        parts.append(f' <span class="flag f-{esc(flag)}">{esc(FLAG_LABELS.get(flag, flag))}</span>')
    parts.append("</summary>")
    return mark_safe("".join(parts))


@lru_cache(maxsize=256)
def _url_pattern(name: str, run_id: int) -> str:
    """A span URL of this run with ``{}`` for the span: reversed once, not once per node."""
    return esc(reverse(name, args=[run_id, 987654321])).replace("987654321", "{}")


def _lazy(run_id: int, node: Node) -> str:
    url = _url_pattern("runs:span-children", run_id).format(node.id)
    return (
        f'<li class="lazy"><a href="{url}" hx-get="{url}" hx-trigger="intersect once" hx-target="closest ul" '
        f'hx-swap="innerHTML">load {int(node.sub_count) - 1} spans below</a></li>'
    )


def more_tasks_html(run_id: int, root_id: int, *, after: int, remaining: int) -> str:
    """The item that loads a large run's next tasks in place of itself (scrolled into view, or clicked)."""
    url = _url_pattern("runs:span-children", run_id).format(root_id) + f"?after={int(after)}"
    shown = min(remaining, TASKS_DRAWN)
    return (
        f'<li class="lazy more-tasks"><a href="{url}" hx-get="{url}" hx-trigger="click, intersect once" '
        f'hx-target="closest li" hx-swap="outerHTML">load the next {shown} of {remaining} more tasks</a></li>'
    )


def _body(run_id: int, node: Node) -> str:
    if node.kind not in ("model_call", "tool_call", "plan", "recovery", "compensation"):
        return ""
    url = _url_pattern("runs:span-payload", run_id).format(node.id)
    # Bodies are fetched when asked for, never pushed; the fetched text lands inside hx-disable.
    return (
        f'<div class="payload-slot"><a href="{url}" download>download</a> '
        f'<a href="{url}?preview=1" hx-get="{url}?preview=1" hx-target="closest .payload-slot" '
        'hx-swap="innerHTML">show</a></div>'
    )


def node_html(node: Node, run_id: int, now, *, mode: str, keep: set[int] | None = None) -> SafeString:
    """A node with its children. ``mode``: "full" (everything, open), "lazy" (children loaded on demand
    when their subtree is large), "shallow" (this node's children are drawn, theirs only on demand),
    "closed" (children only on demand)."""
    children = [c for c in node.children if keep is None or c.id in keep]
    is_open = mode == "full" and node.kind in ("run", "task", "attempt")
    if mode == "shallow":
        kids = "".join(node_html(c, run_id, now, mode="closed") for c in children) + node.more
    elif mode == "closed" or (mode == "lazy" and node.sub_count - 1 > EAGER_SUBTREE_MAX):
        kids = _lazy(run_id, node) if children or node.sub_count > 1 else ""
    else:
        child_mode = "full" if mode == "full" else "lazy"
        kids = "".join(node_html(c, run_id, now, mode=child_mode, keep=keep) for c in children)
    kids_html = f'<ul id="kids-{node.id}" class="kids">{kids}</ul>' if node.kind in CONTAINERS or kids else ""
    return mark_safe(
        f'<li id="node-{node.id}" class="node k-{esc(node.kind)} s-{esc(node.status)}" '
        f'data-parent="kids-{node.parent_id or "root"}"><details id="d-{node.id}"{" open" if is_open else ""}>'
        f"{node_row(node, now)}{_body(run_id, node)}{kids_html}</details></li>"
    )


def tree_html(roots: list[Node], run_id: int, *, total: int, keep: set[int] | None = None) -> SafeString:
    now = timezone.now()
    if keep is not None or total <= FULL_TREE_MAX:
        mode = "full"
    else:
        mode = "shallow"  # the run and its tasks; attempts and calls when a task is opened
    shown = [r for r in roots if keep is None or r.id in keep]
    return mark_safe("".join(node_html(r, run_id, now, mode=mode, keep=keep) for r in shown))


# --- timeline ----------------------------------------------------------------------------------------------
@dataclass
class Bar:
    task_id: int
    key: str
    agent: str
    status: str
    start: datetime | None
    end: datetime | None
    attempts: list = field(default_factory=list)  # (start, end, status)
    critical: bool = False


def critical_path(tasks, now) -> list[int]:
    """The chain that decided the run's length: from the task that finished last, back through the
    dependency that finished last before it started (what it actually waited for)."""
    by_key = {t.key: t for t in tasks}
    started = [t for t in tasks if t.started_at]
    if not started:
        return []
    current = max(started, key=lambda t: t.finished_at or now)
    path = []
    seen = set()
    while current is not None and current.id not in seen:
        seen.add(current.id)
        path.append(current.id)
        deps = [by_key[k] for k in current.depends_on or [] if k in by_key and by_key[k].finished_at]
        current = max(deps, key=lambda t: t.finished_at) if deps else None
    return path[::-1]


def parallel_speedup(tasks, run, now) -> float | None:
    """Sum of task time ÷ wall time: above 1, the fan-out ran things side by side."""
    if not run.started_at:
        return None
    wall = ((run.finished_at or now) - run.started_at).total_seconds()
    busy = sum(((t.finished_at or now) - t.started_at).total_seconds() for t in tasks if t.started_at)
    return busy / wall if wall > 0 else None


def timeline_svg(tasks, attempt_rows, run, critical: set[int], now) -> SafeString:
    """A Gantt chart of tasks and their attempts, the critical path marked."""
    rows = sorted((t for t in tasks if t.started_at), key=lambda t: (t.started_at, t.id))
    if not rows or not run.started_at:
        return mark_safe('<p class="empty">No task has started yet.</p>')  # a constant: nothing to escape
    start = run.started_at
    end = max([run.finished_at or now] + [t.finished_at or now for t in rows])
    span_s = max((end - start).total_seconds(), 0.001)
    label_w, width = 150, 860
    row_h = 16 if len(rows) <= 150 else 6
    plot_w = width - label_w - 10
    height = 24 + row_h * len(rows)

    def x(moment) -> float:
        return label_w + plot_w * max(0.0, (moment - start).total_seconds()) / span_s

    attempts_by_task: dict[int, list] = {}
    for a in attempt_rows:
        attempts_by_task.setdefault(a["task_id"], []).append(a)
    parts = []
    for i in range(5):  # time axis
        px = f1(label_w + plot_w * i / 4)
        parts.append(
            f'<line class="grid" x1="{px}" y1="14" x2="{px}" y2="{height}"/>'
            f'<text class="tick" x="{px}" y="10">{duration(span_s * i / 4 * 1000)}</text>'
        )
    for n, task in enumerate(rows):
        y = 18 + n * row_h
        t_end = task.finished_at or now
        crit = " crit" if task.id in critical else ""
        key, status = esc(task.key), esc(task.status)
        if row_h >= 12:
            parts.append(f'<text class="label{crit}" x="0" y="{f1(y + row_h * 0.7)}">{esc(task.key[:22])}</text>')
        parts.append(
            f'<rect class="task s-{status}{crit}" x="{f1(x(task.started_at))}" y="{f1(y)}" '
            f'width="{f1(max(1.0, x(t_end) - x(task.started_at)))}" height="{f1(row_h - 2)}">'
            f"<title>{key} ({status}) {duration((t_end - task.started_at).total_seconds() * 1000)}</title></rect>"
        )
        for a in attempts_by_task.get(task.id, []):
            a_end = a["ended_at"] or now
            a_status = esc(a["status"]) if a["ended_at"] else "running"
            parts.append(
                f'<rect class="attempt s-{a_status}" x="{f1(x(a["started_at"]))}" y="{f1(y + 2)}" '
                f'width="{f1(max(1.0, x(a_end) - x(a["started_at"])))}" height="{f1(max(1, row_h - 6))}">'
                f"<title>attempt {int(a['attempt'] or 0)} "
                f"{duration((a_end - a['started_at']).total_seconds() * 1000)}</title></rect>"
            )
    return mark_safe(
        f'<svg class="gantt" viewBox="0 0 {width} {height}" width="100%" role="img" '
        f'aria-label="Timeline of tasks and attempts">{"".join(parts)}</svg>'
    )
