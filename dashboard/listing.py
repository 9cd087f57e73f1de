"""The dashboard's runs list: its filters (read from a query string), the selector that reads a page of
runs with each row's figures in the same query, and one row rendered on its own for live updates.

Pages are keyset-paginated on id descending (``after=<id>``): no OFFSET, and no COUNT(*) of the table.
"""

import re
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from urllib.parse import urlencode

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.template.loader import render_to_string
from django.utils import timezone

from agents.models import Workflow
from approvals.models import ApprovalRequest
from core.errors import NotFound
from runs.models import Run, Task
from runs.selectors import set_aside_by_replan
from tenancy.access import project_ids, visible_rows
from tenancy.models import Project

PAGE_SIZE = 50
SEARCH_MAX_LENGTH = 200
SLUG = re.compile(r"^[-a-zA-Z0-9_]+$")
RUN_ID = re.compile(r"^(?:#|run\s*)?(\d{1,18})$", re.IGNORECASE)
# What a row shows; nothing else is loaded (a run's input can be large, a workflow's plan too).
ROW_FIELDS = (
    "id",
    "status",
    "status_reason",
    "goal",
    "workflow__slug",
    "project__slug",
    "started_by__username",
    "steps_used",
    "max_steps",
    "tokens_used",
    "max_tokens",
    "cost_micros",
    "max_cost_micros",
    "created_at",
    "started_at",
    "finished_at",
)


@dataclass
class RunFilters:
    """What the list is narrowed to. Values that failed validation are left out and explained in ``errors``."""

    statuses: list[str] = field(default_factory=list)
    workflow: str = ""
    project: str = ""
    starter: str = ""
    since: date | None = None
    until: date | None = None
    q: str = ""
    after: int | None = None
    errors: list[str] = field(default_factory=list)

    def params(self) -> list[tuple[str, str]]:
        """The filter as query-string pairs, without the page position (for links and hidden fields)."""
        pairs = [("status", s) for s in self.statuses]
        for name in ("workflow", "project", "starter", "q"):
            if getattr(self, name):
                pairs.append((name, getattr(self, name)))
        for name in ("since", "until"):
            if getattr(self, name):
                pairs.append((name, getattr(self, name).isoformat()))
        return pairs

    def querystring(self, **extra) -> str:
        return urlencode(self.params() + [(k, str(v)) for k, v in extra.items()])

    @property
    def active(self) -> bool:
        return bool(self.params())

    def describe(self) -> str:
        """The filter in words, for a page that acts on its runs."""
        parts = [f"status {' or '.join(s.replace('_', ' ') for s in self.statuses)}"] if self.statuses else []
        for name, label in (("workflow", "workflow"), ("project", "project"), ("starter", "started by")):
            if getattr(self, name):
                parts.append(f"{label} {getattr(self, name)}")
        if self.since:
            parts.append(f"created since {self.since.isoformat()}")
        if self.until:
            parts.append(f"created until {self.until.isoformat()}")
        if self.q:
            parts.append(f"matching “{self.q}”")
        return ", ".join(parts)


def _date(value: str, label: str, errors: list[str]) -> date | None:
    if not value:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        errors.append(f"“{value[:40]}” is not a date (YYYY-MM-DD): the {label} date was ignored.")
        return None


def filters_parse(params, *, workflows=None, projects=None) -> RunFilters:
    """Read the filters from a QueryDict (GET, or a bulk form's hidden fields). ``workflows``/``projects``:
    the slugs that may be chosen; an unknown one is reported and ignored rather than matching nothing."""
    f = RunFilters()
    errors = f.errors
    known = set(Run.Status.values)
    for status in params.getlist("status"):
        if status in known:
            if status not in f.statuses:
                f.statuses.append(status)
        elif status:
            errors.append(f"“{status[:40]}” is not a run status: it was ignored.")
    for name, choices in (("workflow", workflows), ("project", projects)):
        value = params.get(name, "").strip()
        if not value:
            continue
        if not SLUG.match(value) or len(value) > 64 or (choices is not None and value not in choices):
            errors.append(f"There is no {name} “{value[:64]}” here: the {name} filter was ignored.")
        else:
            setattr(f, name, value)
    starter = params.get("starter", "").strip()
    if len(starter) > 150:
        errors.append("A username has at most 150 characters: the “started by” filter was ignored.")
    else:
        f.starter = starter
    f.since = _date(params.get("since", "").strip(), "“created since”", errors)
    f.until = _date(params.get("until", "").strip(), "“created until”", errors)
    if f.since and f.until and f.since > f.until:
        errors.append("“Created since” is after “created until”: the range was ignored.")
        f.since = f.until = None
    q = " ".join(params.get("q", "").split())
    if len(q) > SEARCH_MAX_LENGTH:
        errors.append(f"The search text was cut to its first {SEARCH_MAX_LENGTH} characters.")
        q = q[:SEARCH_MAX_LENGTH]
    f.q = q
    after = params.get("after", "").strip()
    if after:
        if after.isdigit() and 0 < int(after) < 2**63:
            f.after = int(after)
        else:
            errors.append(f"“{after[:40]}” is not a page position: showing the first page.")
    return f


def filter_choices(user) -> dict:
    """The workflows and projects the filter form offers ``user``: two queries."""
    visible = project_ids(user, "view")
    projects = Project.objects.order_by("slug")
    workflows = Workflow.objects.order_by("slug")
    if visible is not None:
        projects = projects.filter(id__in=visible)
        workflows = workflows.filter(Q(project__isnull=True) | Q(project_id__in=visible))
    return {
        "workflows": list(workflows.values_list("slug", flat=True)),
        "projects": list(projects.values_list("slug", flat=True)),
    }


def _day_start(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))


def _count(rows: QuerySet) -> Subquery:
    """COUNT(*) of ``rows`` (correlated to the outer run) as a column; 0 when there are none."""
    return Coalesce(Subquery(rows.order_by().values("run").annotate(n=Count("id")).values("n")[:1]), 0)


def runs_annotated(runs: QuerySet) -> QuerySet:
    """Each run with its row figures (tasks, tasks done, pending approvals), computed by the database
    per row of the page: the number of queries does not grow with the number of runs."""
    tasks = Task.objects.filter(run=OuterRef("pk"))
    pending = ApprovalRequest.objects.filter(run=OuterRef("pk"), status=ApprovalRequest.Status.PENDING, parent=None)
    return (
        runs.select_related("workflow", "project", "started_by")
        .only(*ROW_FIELDS, "workflow_id", "project_id", "started_by_id")
        .annotate(
            tasks_total=_count(tasks.exclude(set_aside_by_replan(OuterRef("plan_version")))),
            tasks_done=_count(tasks.filter(status=Task.Status.COMPLETED)),
            approvals_pending=_count(pending),
        )
    )


def _contains(field: str, text: str) -> Q:
    """A case-insensitive substring match. On PostgreSQL, as a regex of the escaped text: the planner has
    statistics for ``goal ~* …`` but none for icontains' ``UPPER(goal) LIKE …``, and without them it
    sorts every match instead of walking the id index back until the page is full."""
    if connection.vendor == "postgresql":
        return Q(**{f"{field}__iregex": re.escape(text)})
    return Q(**{f"{field}__icontains": text})


def _id_of(rows: QuerySet) -> Subquery:
    return Subquery(rows.values("id")[:1])


def runs_filtered(*, user, filters: RunFilters) -> QuerySet:
    """The runs of ``user``'s projects that match ``filters``, newest first, from ``filters.after`` on;
    no figures (the bulk actions select ids with this)."""
    runs = visible_rows(Run.objects.order_by("-id"), user)
    if filters.statuses:
        runs = runs.filter(status__in=filters.statuses)
    # By id, from a scalar subquery rather than a join: the (column, id) indexes then yield the runs of one
    # project, workflow or person newest first, however long ago its last run was.
    if filters.workflow:
        runs = runs.filter(workflow_id=_id_of(Workflow.objects.filter(slug=filters.workflow)))
    if filters.project:
        runs = runs.filter(project_id=_id_of(Project.objects.filter(slug=filters.project)))
    if filters.starter:
        runs = runs.filter(started_by_id=_id_of(get_user_model().objects.filter(username=filters.starter)))
    if filters.since:
        runs = runs.filter(created_at__gte=_day_start(filters.since))
    if filters.until:
        runs = runs.filter(created_at__lt=_day_start(filters.until + timedelta(days=1)))
    if filters.q:
        run_id = RUN_ID.match(filters.q)
        if run_id and not filters.q.isdigit():  # "#42", "run 42": that run; "42" may be in a goal too
            runs = runs.filter(id=int(run_id.group(1)))
        else:
            # The workflows by a subquery, not through the join: the join would test each goal once per workflow.
            workflows = Workflow.objects.filter(_contains("slug", filters.q)).values("id")
            match = _contains("goal", filters.q) | Q(workflow_id__in=workflows)
            runs = runs.filter(match | Q(id=int(filters.q)) if run_id else match)
    if filters.after:
        runs = runs.filter(id__lt=filters.after)
    return runs


def runs_for_list(*, user, filters: RunFilters, limit: int = PAGE_SIZE + 1) -> QuerySet:
    """A page of the list: at most ``limit`` runs (one more than a page tells whether there is a next).

    One query: the page's ids are chosen by a subquery that reads nothing else, so the row figures are
    computed for those runs only (SQLite computes a row's columns before it sorts, PostgreSQL may too)."""
    page = runs_filtered(user=user, filters=filters).values("id")[:limit]
    return runs_annotated(Run.objects.filter(id__in=page)).order_by("-id")


def _duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def rows_prepare(runs, now=None) -> list[Run]:
    """What a row computes in Python: its cost in dollars, and its duration (a run not finished yet:
    since it started)."""
    now = now or timezone.now()
    runs = list(runs)
    for run in runs:
        run.cost_label = f"${run.cost_micros / 1_000_000:.4f}"
        run.cost_limit_label = "" if run.max_cost_micros is None else f"${run.max_cost_micros / 1_000_000:.4f}"
        if run.started_at is None:
            run.duration = ""
        else:
            end = run.finished_at if run.is_terminal and run.finished_at else now
            run.duration = _duration((end - run.started_at).total_seconds())
    return runs


def run_row_html(run_id: int) -> tuple[int, str]:
    """(project id, the run's ``run-row`` fragment), for the live-update publisher. Renders without a
    request: whoever receives it must be allowed to view the project, which the caller checks."""
    run = runs_annotated(Run.objects.filter(id=run_id)).first()
    if run is None:
        raise NotFound(f"run {run_id} does not exist")
    (run,) = rows_prepare([run])
    return run.project_id, render_to_string("runs/list.html#run-row", {"run": run})
