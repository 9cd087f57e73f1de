"""The run page's trace tree and timeline, built from light span rows in one pass.

Nodes are rendered with ``format_html`` rather than a template per node: a run page may draw a thousand
task nodes and their bars, and a template include per node costs ten times as much. Every value that
came from a model, a tool or an operator goes through ``format_html``'s escaping; names sit inside
``hx-disable`` so htmx never processes attributes found in them.
"""

from dataclasses import dataclass, field
from datetime import datetime

from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from .models import Span

SPAN_FIELDS = (
    "id",
    "parent_id",
    "task_id",
    "kind",
    "name",
    "status",
    "attempt",
    "step",
    "started_at",
    "ended_at",
    "tokens_in",
    "tokens_out",
    "cost_micros",
    "payload_id",
)
FULL_TREE_MAX = 400  # spans: a run this small is drawn whole and open
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
ONLY_CHOICES = {"failed": "failed", "approval": "awaiting approval", "irreversible": "irreversible"}


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

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out

    def duration_ms(self, now=None) -> float | None:
        end = self.ended_at or now
        return None if end is None else (end - self.started_at).total_seconds() * 1000


def span_rows(run_id: int, **filters) -> list[dict]:
    return list(Span.objects.filter(run_id=run_id, **filters).order_by("id").values(*SPAN_FIELDS))


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
    return flags


def tree_build(rows: list[dict], op_flags: dict | None = None) -> tuple[list[Node], dict[int, Node]]:
    """Roots and an index of every node, with subtree totals (tokens, cost, spans, errors)."""
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
    for node in sorted(nodes.values(), key=lambda n: -n.id):  # children before parents
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


def node_row(node: Node, now) -> SafeString:
    """The node's summary line: what a push replaces when the node changes."""
    subtree = ""
    if node.children or node.kind in ("run", "task", "attempt"):
        subtree = format_html(
            '<span class="sub" title="this node and everything below it">Σ {} tok · {} · {} spans{}</span>',
            node.sub_tokens,
            money(node.sub_cost),
            node.sub_count,
            format_html(" · {} failed", node.sub_errors) if node.sub_errors else "",
        )
    own = ""
    if node.kind in ("model_call", "tool_call") or node.tokens:
        own = format_html(
            '<span class="tok">{} tok</span> <span class="cost">{}</span>', node.tokens, money(node.cost_micros)
        )
    flags = format_html_join(" ", '<span class="flag f-{}">{}</span>', ((f, f) for f in sorted(node.flags)))
    label = KIND_LABELS.get(node.kind, node.kind)
    step = format_html('<span class="step">step {}</span>', node.step) if node.step else ""
    attempt = ""
    return format_html(
        '<summary id="row-{}" data-row><span class="kind">{}{}</span> <span class="name" hx-disable>{}</span> {} '
        '<span class="badge s-{}">{}</span> <span class="dur">{}</span> {} {} {}</summary>',
        node.id,
        label,
        attempt,
        node.name,
        step,
        node.status if node.ended_at or node.status != "ok" else "running",
        node.status if node.ended_at or node.status != "ok" else "running",
        duration(node.duration_ms(now)),
        own,
        subtree,
        flags,
    )


def _lazy(run_id: int, node: Node) -> SafeString:
    url = reverse("runs:span-children", args=[run_id, node.id])
    return format_html(
        '<li class="lazy"><a href="{}" hx-get="{}" hx-trigger="intersect once" hx-target="closest ul" '
        'hx-swap="innerHTML">load {} spans below</a></li>',
        url,
        url,
        node.sub_count - 1,
    )


def _body(run_id: int, node: Node) -> SafeString:
    if node.kind not in ("model_call", "tool_call", "plan", "recovery", "compensation"):
        return mark_safe("")
    url = reverse("runs:span-payload", args=[run_id, node.id])
    # Bodies are fetched when asked for, never pushed; the fetched text lands inside hx-disable.
    return format_html(
        '<div class="payload-slot"><a href="{}" download>download</a> '
        '<a href="{}?preview=1" hx-get="{}?preview=1" hx-target="closest .payload-slot" '
        'hx-swap="innerHTML">show</a></div>',
        url,
        url,
        url,
    )


def node_html(node: Node, run_id: int, now, *, mode: str, keep: set[int] | None = None) -> SafeString:
    """A node with its children. ``mode``: "full" (everything, open), "lazy" (children loaded on demand
    when their subtree is large), "shallow" (this node's children are drawn, theirs only on demand)."""
    children = [c for c in node.children if keep is None or c.id in keep]
    is_open = mode == "full" and node.kind in ("run", "task", "attempt")
    if mode == "shallow":
        kids = format_html_join("", "{}", ((node_html(c, run_id, now, mode="lazy"),) for c in children))
    elif mode == "lazy" and node.sub_count - 1 > EAGER_SUBTREE_MAX:
        kids = _lazy(run_id, node) if children else ""
    else:
        child_mode = "full" if mode == "full" else "lazy"
        kids = format_html_join("", "{}", ((node_html(c, run_id, now, mode=child_mode, keep=keep),) for c in children))
    kids_html = (
        format_html('<ul id="kids-{}" class="kids">{}</ul>', node.id, kids)
        if node.kind
        in (
            "run",
            "task",
            "attempt",
        )
        or children
        else mark_safe("")
    )
    return format_html(
        '<li id="node-{}" class="node k-{} s-{}" data-parent="kids-{}"><details id="d-{}"{}>{}{}{}</details></li>',
        node.id,
        node.kind,
        node.status,
        node.parent_id or "root",
        node.id,
        mark_safe(" open") if is_open else "",
        node_row(node, now),
        _body(run_id, node),
        kids_html,
    )


def tree_html(roots: list[Node], run_id: int, *, total: int, keep: set[int] | None = None) -> SafeString:
    now = timezone.now()
    if keep is not None or total <= FULL_TREE_MAX:
        mode = "full"
    else:
        mode = "shallow"  # the run and its tasks; attempts and calls when a task is opened
    shown = [r for r in roots if keep is None or r.id in keep]
    return format_html_join("", "{}", ((node_html(r, run_id, now, mode=mode, keep=keep),) for r in shown))


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
        return format_html('<p class="empty">No task has started yet.</p>')
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
        moment_s = span_s * i / 4
        px = label_w + plot_w * i / 4
        parts.append(
            format_html(
                '<line class="grid" x1="{}" y1="14" x2="{}" y2="{}"/><text class="tick" x="{}" y="10">{}</text>',
                f1(px),
                f1(px),
                height,
                f1(px),
                duration(moment_s * 1000),
            )
        )
    for n, task in enumerate(rows):
        y = 18 + n * row_h
        t_end = task.finished_at or now
        crit = " crit" if task.id in critical else ""
        if row_h >= 12:
            parts.append(
                format_html('<text class="label{}" x="0" y="{}">{}</text>', crit, f1(y + row_h * 0.7), task.key[:22])
            )
        parts.append(
            format_html(
                '<rect class="task s-{}{}" x="{}" y="{}" width="{}" height="{}"><title>{} ({}) {}</title></rect>',
                task.status,
                crit,
                f1(x(task.started_at)),
                f1(y),
                f1(max(1.0, x(t_end) - x(task.started_at))),
                f1(row_h - 2),
                task.key,
                task.status,
                duration((t_end - task.started_at).total_seconds() * 1000),
            )
        )
        for a in attempts_by_task.get(task.id, []):
            a_end = a["ended_at"] or now
            parts.append(
                format_html(
                    '<rect class="attempt s-{}" x="{}" y="{}" width="{}" height="{}">'
                    "<title>attempt {} {}</title></rect>",
                    a["status"] if a["ended_at"] else "running",
                    f1(x(a["started_at"])),
                    f1(y + 2),
                    f1(max(1.0, x(a_end) - x(a["started_at"]))),
                    f1(max(1, row_h - 6)),
                    a["attempt"] or "",
                    duration((a_end - a["started_at"]).total_seconds() * 1000),
                )
            )
    return format_html(
        '<svg class="gantt" viewBox="0 0 {} {}" width="100%" role="img" '
        'aria-label="Timeline of tasks and attempts">{}</svg>',
        width,
        height,
        format_html_join("", "{}", ((p,) for p in parts)),
    )
