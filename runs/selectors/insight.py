"""The insight page's figures: how runs went over a period, for the projects a user may view.

Definitions (the page repeats them):

- The period is the last ``days`` calendar days including today (server time zone); a run belongs to it,
  and to a day, by when it was created. Operations, tasks and approval requests count with their run.
- A run is *finished* when it is completed, failed, cancelled, compensated, or needs attention (stopped
  until someone acts: not a success). *Success rate* = completed ÷ finished.
- *Cost per successful run* = the cost of every run of the period (failures included) ÷ completed runs;
  *mean cost of a successful run* = what the completed runs cost ÷ completed runs; *cost of failed runs* =
  what the finished runs that did not complete cost (their mean: ÷ those runs).
- *Cost and tokens by agent and by model*: the model calls of the period's runs, per day or ISO week.
- *Duration*: started → finished, of runs that reached a terminal status (completed, failed, cancelled,
  compensated; a run needing attention has not finished).
- *Steps per run*: the steps (model responses and tool results journaled) of every run of the period.
  Runs beyond the p95 are listed: a long tail flags loops.
- Percentiles are nearest-rank: p95 is the smallest value that at least 95 % of the values do not exceed.
- *Failing tools*: ledger rows failed, ambiguous or whose compensation failed. *Failing agents*: failed tasks.
- *Approval waits*: requested → decided, of top-level requests a reviewer approved or rejected; pending,
  expired and withdrawn requests are counted apart.

Counts and sums are grouped in the database (by day, workflow and project at once); only percentiles
read one value per run. A page costs the same handful of queries however many runs there are.

The insight page and GET /api/v1/insight both read here. It sits with the approvals app because one of its
six queries counts approval requests (``_approvals``), the highest model it reads; with those rows below the
engine it belongs in runs.selectors.
"""

import datetime as dt
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db.models import Case, Count, DurationField, ExpressionWrapper, F, Q, Sum, When
from django.db.models.functions import TruncDate
from django.utils import timezone

from agents.models import Workflow
from policy.models import ApprovalRequest
from runs.models import Run, Task
from runs.selectors.usage import Usage, usage_compute
from tenancy.models import Project
from tools.models import ToolOperation

PERIODS = (7, 30, 90)
DEFAULT_DAYS = 30
FINISHED = (
    Run.Status.COMPLETED,
    Run.Status.FAILED,
    Run.Status.CANCELLED,
    Run.Status.COMPENSATED,
    Run.Status.NEEDS_ATTENTION,
)
FAILING_OPERATIONS = (
    ToolOperation.Status.FAILED,
    ToolOperation.Status.AMBIGUOUS,
    ToolOperation.Status.COMPENSATION_FAILED,
)
DECIDED = (ApprovalRequest.Status.APPROVED, ApprovalRequest.Status.REJECTED)
TOP = 10  # failing tools and agents shown
TAIL_LISTED = 50  # runs beyond the p95 listed by id
STEP_BINS = 20
# Approval waits: seconds, on a scale people think in.
WAIT_EDGES = (0, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
WAIT_LABELS = ("< 1 min", "1–5 min", "5–15 min", "15–60 min", "1–4 h", "4–24 h", "≥ 1 day")


@dataclass(frozen=True)
class Bin:
    """A histogram bin ``[lo, hi)``; ``hi`` None: open-ended (the last bin)."""

    lo: float
    hi: float | None
    count: int
    label: str


def percentile(values: Iterable[float], p: float) -> float | None:
    """Nearest-rank percentile: the smallest value with at least ``p`` % of the values at or below it."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(math.ceil(p / 100 * len(ordered)), 1)
    return ordered[rank - 1]


def fmt_pct(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio * 100:.1f} %"


def fmt_usd(micros: float | None) -> str:
    if micros is None:
        return "—"
    usd = micros / 1_000_000
    return f"${usd:,.2f}" if usd >= 10 else f"${usd:.4f}"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 10:
        return f"{seconds:.1f} s"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"


def fmt_number(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


@dataclass
class Figures:
    """The figures of one group of runs: the whole selection, one day, one workflow or one project."""

    key: object
    label: str
    runs: int = 0
    finished: int = 0
    completed: int = 0
    cost_micros: int = 0
    completed_cost_micros: int = 0
    failed_cost_micros: int = 0  # finished runs that did not complete
    failed_operations: int = 0
    failed_tasks: int = 0
    pending_approvals: int = 0
    steps: list[int] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)  # seconds
    waits: list[float] = field(default_factory=list)  # seconds

    @property
    def success_rate(self) -> float | None:
        return self.completed / self.finished if self.finished else None

    @property
    def cost_per_success(self) -> float | None:
        """Micro-dollars: everything the group's runs cost, per completed run."""
        return self.cost_micros / self.completed if self.completed else None

    @property
    def mean_success_cost(self) -> float | None:
        return self.completed_cost_micros / self.completed if self.completed else None

    @property
    def mean_failed_cost(self) -> float | None:
        failed = self.finished - self.completed
        return self.failed_cost_micros / failed if failed else None

    @property
    def steps_p50(self):
        return percentile(self.steps, 50)

    @property
    def steps_p95(self):
        return percentile(self.steps, 95)

    @property
    def duration_p50(self):
        return percentile(self.durations, 50)

    @property
    def duration_p95(self):
        return percentile(self.durations, 95)

    @property
    def wait_p50(self):
        return percentile(self.waits, 50)

    @property
    def wait_p95(self):
        return percentile(self.waits, 95)

    # What the template shows.
    def success_rate_text(self):
        return fmt_pct(self.success_rate)

    def cost_text(self):
        return fmt_usd(self.cost_micros)

    def cost_per_success_text(self):
        return fmt_usd(self.cost_per_success)

    def mean_success_cost_text(self):
        return fmt_usd(self.mean_success_cost)

    def failed_cost_text(self):
        return fmt_usd(self.failed_cost_micros)

    def mean_failed_cost_text(self):
        return fmt_usd(self.mean_failed_cost)

    def steps_text(self):
        return f"{fmt_number(self.steps_p50)} / {fmt_number(self.steps_p95)}"

    def duration_text(self):
        return f"{fmt_duration(self.duration_p50)} / {fmt_duration(self.duration_p95)}"

    def wait_text(self):
        return f"{fmt_duration(self.wait_p50)} / {fmt_duration(self.wait_p95)}"


@dataclass(frozen=True)
class TailRun:
    id: int
    steps: int
    status: str
    workflow: str


@dataclass
class Insight:
    days: int
    since: dt.datetime
    total: Figures
    by_day: list[Figures]
    by_workflow: list[Figures]
    by_project: list[Figures]
    step_bins: list[Bin]
    tail: list[TailRun]  # runs beyond the p95 of steps, most steps first (at most TAIL_LISTED)
    tail_count: int
    wait_bins: list[Bin]
    approvals: dict[str, int]  # top-level requests by status
    top_tools: list[tuple[str, int]]
    top_agents: list[tuple[str, int]]
    usage: Usage  # cost and tokens per agent and per model, per day or week (runs/selectors/usage.py)


def insight_choices(*, visible: list[int] | None) -> tuple[list[Project], list[Workflow]]:
    """What the filters offer: the projects the user may view, and the workflows that have runs there
    (never a workflow seen only in someone else's project). Two queries."""
    projects = Project.objects.order_by("name", "slug")
    workflows = Workflow.objects.filter(runs__isnull=False)
    if visible is not None:
        projects = projects.filter(id__in=visible)
        workflows = Workflow.objects.filter(runs__project_id__in=visible)
    return list(projects.only("id", "slug", "name")), list(
        workflows.distinct().order_by("name", "slug").only("id", "slug", "name")
    )


def period_start(days: int, now: dt.datetime | None = None) -> dt.datetime:
    """Midnight (current time zone) at the start of the first of the last ``days`` days, today included."""
    today = timezone.localdate(now or timezone.now())
    first = today - dt.timedelta(days=days - 1)
    return timezone.make_aware(dt.datetime.combine(first, dt.time.min))


def _runs_q(prefix: str, *, visible, since, workflow_id, project_id) -> Q:
    """Runs of the selection, as a filter on Run (``prefix`` "") or on a row with a run (``"run__"``)."""
    q = Q(**{f"{prefix}created_at__gte": since})
    if visible is not None:
        q &= Q(**{f"{prefix}project_id__in": visible})
    if workflow_id is not None:
        q &= Q(**{f"{prefix}workflow_id": workflow_id})
    if project_id is not None:
        q &= Q(**{f"{prefix}project_id": project_id})
    return q


class _Groups:
    """The figures a row counts in: the total, its day, its workflow and its project."""

    def __init__(self, *, days: int, today: dt.date, workflows: list[Workflow], projects: list[Project]):
        self.total = Figures(key=None, label="All runs")
        self.by_day = {
            d: Figures(key=d, label=d.isoformat())
            for d in (today - dt.timedelta(days=n) for n in range(days - 1, -1, -1))
        }
        self.wf_names = {w.id: w.name or w.slug for w in workflows}
        self.pr_names = {p.id: p.name or p.slug for p in projects}
        self.by_workflow: dict[int, Figures] = {}
        self.by_project: dict[int, Figures] = {}

    def of(self, d, workflow, project) -> list[Figures]:
        if workflow not in self.by_workflow:
            label = self.wf_names.get(workflow, f"workflow {workflow}")
            self.by_workflow[workflow] = Figures(key=workflow, label=label)
        if project not in self.by_project:
            self.by_project[project] = Figures(key=project, label=self.pr_names.get(project, f"project {project}"))
        found = [self.total, self.by_workflow[workflow], self.by_project[project]]
        if d in self.by_day:  # a run created "in the future" by clock skew counts in the total only
            found.append(self.by_day[d])
        return found


def insight_compute(
    *,
    visible: list[int] | None,
    projects: list[Project],
    workflows: list[Workflow],
    days: int = DEFAULT_DAYS,
    workflow_id: int | None = None,
    project_id: int | None = None,
    now: dt.datetime | None = None,
    grain: str = "day",
) -> Insight:
    """The figures of the runs created in the last ``days`` days in the ``visible`` projects (None: all),
    optionally of one workflow and one project. ``projects`` and ``workflows`` name the groups (from
    ``insight_choices``). Six queries."""
    since = period_start(days, now)
    scope = {"visible": visible, "since": since, "workflow_id": workflow_id, "project_id": project_id}
    runs = Run.objects.filter(_runs_q("", **scope)).order_by()
    today = timezone.localdate(now or timezone.now())
    groups = _Groups(days=days, today=today, workflows=workflows, projects=projects)
    _count_runs(runs, groups)
    per_run = _per_run(runs, groups)
    in_scope = _runs_q("run__", **scope)
    tools, agents = _failures(in_scope, groups)
    approvals = _approvals(in_scope, groups)

    total = groups.total
    p95 = total.steps_p95
    beyond = sorted((r for r in per_run if p95 is not None and r[5] > p95), key=lambda r: (-r[5], -r[0]))
    tail = [
        TailRun(id=r[0], steps=r[5], status=r[4], workflow=groups.wf_names.get(r[2], "")) for r in beyond[:TAIL_LISTED]
    ]

    def by_runs(figures: dict) -> list[Figures]:
        return sorted(figures.values(), key=lambda g: (-g.runs, g.label))

    return Insight(
        days=days,
        since=since,
        total=total,
        by_day=list(groups.by_day.values()),
        by_workflow=by_runs(groups.by_workflow),
        by_project=by_runs(groups.by_project),
        step_bins=step_bins(total.steps),
        tail=tail,
        tail_count=len(beyond),
        wait_bins=wait_bins(total.waits),
        approvals={s: approvals.get(s, 0) for s in ApprovalRequest.Status.values},
        top_tools=_top(tools),
        top_agents=_top(agents),
        usage=usage_compute(runs_q=in_scope, since=since, today=today, grain=grain),
    )


def _count_runs(runs, groups: _Groups) -> None:
    """1. Counts and costs, grouped in the database by (day, workflow, project)."""
    completed = Q(status=Run.Status.COMPLETED)
    for row in (
        runs.annotate(day=TruncDate("created_at"))
        .values("day", "workflow_id", "project_id")
        .annotate(
            n=Count("id"),
            finished=Count("id", filter=Q(status__in=FINISHED)),
            completed=Count("id", filter=completed),
            cost=Sum("cost_micros"),
            completed_cost=Sum("cost_micros", filter=completed),
            failed_cost=Sum("cost_micros", filter=Q(status__in=FINISHED) & ~completed),
        )
    ):
        for g in groups.of(row["day"], row["workflow_id"], row["project_id"]):
            g.runs += row["n"]
            g.finished += row["finished"]
            g.completed += row["completed"]
            g.cost_micros += row["cost"] or 0
            g.completed_cost_micros += row["completed_cost"] or 0
            g.failed_cost_micros += row["failed_cost"] or 0


def _per_run(runs, groups: _Groups) -> list[tuple]:
    """2. One row per run for the percentiles: steps, and the duration of a run that ended."""
    duration = Case(
        When(
            status__in=Run.TERMINAL,
            started_at__isnull=False,
            finished_at__isnull=False,
            then=ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField()),
        ),
        default=None,
        output_field=DurationField(),
    )
    per_run = list(
        runs.annotate(day=TruncDate("created_at"), duration=duration).values_list(
            "id", "day", "workflow_id", "project_id", "status", "steps_used", "duration"
        )
    )
    for _id, d, workflow, project, _status, steps, took in per_run:
        for g in groups.of(d, workflow, project):
            g.steps.append(steps)
            if took is not None:
                g.durations.append(took.total_seconds())
    return per_run


def _failures(in_scope: Q, groups: _Groups) -> tuple[Counter, Counter]:
    """3. Failing tool operations and 4. failed tasks, grouped like the runs."""
    run_day = TruncDate("run__created_at")
    tools: Counter[str] = Counter()
    for row in (
        ToolOperation.objects.filter(in_scope, status__in=FAILING_OPERATIONS)
        .order_by()
        .annotate(day=run_day)
        .values("tool", "day", "run__workflow_id", "run__project_id")
        .annotate(n=Count("id"))
    ):
        tools[row["tool"]] += row["n"]
        for g in groups.of(row["day"], row["run__workflow_id"], row["run__project_id"]):
            g.failed_operations += row["n"]
    agents: Counter[str] = Counter()
    for row in (
        Task.objects.filter(in_scope, status=Task.Status.FAILED)
        .order_by()
        .annotate(day=run_day)
        .values("agent__slug", "agent__name", "day", "run__workflow_id", "run__project_id")
        .annotate(n=Count("id"))
    ):
        agents[row["agent__name"] or row["agent__slug"]] += row["n"]
        for g in groups.of(row["day"], row["run__workflow_id"], row["run__project_id"]):
            g.failed_tasks += row["n"]
    return tools, agents


def _approvals(in_scope: Q, groups: _Groups) -> Counter:
    """5. Approval requests: one row each (waits are percentiles), top-level only."""
    wait = ExpressionWrapper(F("decided_at") - F("requested_at"), output_field=DurationField())
    approvals: Counter[str] = Counter()
    for status, waited, d, workflow, project in (
        ApprovalRequest.objects.filter(in_scope, parent=None)
        .order_by()
        .annotate(day=TruncDate("run__created_at"), wait=wait)
        .values_list("status", "wait", "day", "run__workflow_id", "run__project_id")
    ):
        approvals[status] += 1
        for g in groups.of(d, workflow, project):
            if status == ApprovalRequest.Status.PENDING:
                g.pending_approvals += 1
            elif status in DECIDED and waited is not None:
                g.waits.append(max(waited.total_seconds(), 0.0))
    return approvals


def _top(counts: Counter) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP]


def step_width(largest: int, max_bins: int = STEP_BINS) -> int:
    """The smallest round bin width (1, 2, 5, 10, 20, 50 …) that covers 0..``largest`` in ``max_bins``."""
    width, i = 1, 0
    while largest // width + 1 > max_bins:
        i += 1
        width = (1, 2, 5)[i % 3] * 10 ** (i // 3)
    return width


def step_bins(steps: list[int]) -> list[Bin]:
    """Bins of steps per run from 0 to the largest; an integer ``n`` occupies ``[n, n + 1)``."""
    if not steps:
        return []
    width = step_width(max(steps))
    counts = Counter(s // width for s in steps)
    bins = []
    for i in range(max(steps) // width + 1):
        lo = i * width
        label = str(lo) if width == 1 else f"{lo}–{lo + width - 1}"
        bins.append(Bin(lo=lo, hi=lo + width, count=counts.get(i, 0), label=label))
    return bins


def wait_bins(waits: list[float]) -> list[Bin]:
    if not waits:
        return []
    edges = [*WAIT_EDGES, None]
    counts = Counter()
    for w in waits:
        counts[next(i for i in range(len(WAIT_EDGES) - 1, -1, -1) if w >= WAIT_EDGES[i])] += 1
    return [
        Bin(lo=edges[i], hi=edges[i + 1], count=counts.get(i, 0), label=WAIT_LABELS[i]) for i in range(len(WAIT_EDGES))
    ]
