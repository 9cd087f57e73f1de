"""The runs list's reads: a page of runs with each row's figures in the same query, the runs a filter
matches (the bulk actions select with it), and the choices its form offers. ``visible`` is the viewer's
scope: the ids of the projects they may see (tenancy.access.project_ids), None for every project.

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
from django.utils import timezone

from agents.models import Workflow
from runs.models import Run, Task
from tenancy.models import Project

from . import set_aside_by_replan

PAGE_SIZE = 50
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
    "mode",  # a what-if replay is marked in its row
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


def filter_choices(*, visible: list[int] | None) -> dict:
    """The slugs of the workflows and projects the filter form offers a viewer of the ``visible`` projects:
    two queries."""
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


def runs_annotated(runs: QuerySet, *, pending_approvals: QuerySet) -> QuerySet:
    """Each run with its row figures (tasks, tasks done, pending approvals), computed by the database
    per row of the page: the number of queries does not grow with the number of runs.
    ``pending_approvals``: the pending requests as the queue counts them
    (approvals.selectors.queue.approvals_pending_counted), correlated to each run here."""
    tasks = Task.objects.filter(run=OuterRef("pk"))
    pending = pending_approvals.filter(run=OuterRef("pk"))
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


def _of_workflows_named(text: str) -> Q:
    """The runs of the workflows whose slug holds ``text``. Their ids are read first, in a query of their
    own (the workflows are few): the search's OR then names a list the planner can estimate, or has no
    second side at all. Inside the runs' query, as ``IN (subquery)`` or ``= ANY(ARRAY(subquery))``, the
    planner guessed that side matched ~90% of the runs, walked the id index back through a million rows
    (1.3 s) and never used the goals' trigram index (runs 0028), which answers a rare phrase in ~1 ms."""
    ids = list(Workflow.objects.filter(_contains("slug", text)).order_by().values_list("id", flat=True))
    return Q(workflow_id__in=ids) if ids else Q(pk__in=[])


def _id_of(rows: QuerySet) -> Subquery:
    return Subquery(rows.values("id")[:1])


def runs_filtered(*, visible: list[int] | None, filters: RunFilters) -> QuerySet:
    """The runs of the ``visible`` projects (None: all) that match ``filters``, newest first, from
    ``filters.after`` on; no figures (the bulk actions select ids with this)."""
    runs = Run.objects.order_by("-id")
    if visible is not None:
        runs = runs.filter(project_id__in=visible)
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
            match = _contains("goal", filters.q) | _of_workflows_named(filters.q)
            runs = runs.filter(match | Q(id=int(filters.q)) if run_id else match)
    if filters.after:
        runs = runs.filter(id__lt=filters.after)
    return runs


def runs_for_list(
    *, visible: list[int] | None, filters: RunFilters, pending_approvals: QuerySet, limit: int = PAGE_SIZE + 1
) -> QuerySet:
    """A page of the list: at most ``limit`` runs (one more than a page tells whether there is a next).

    One query: the page's ids are chosen by a subquery that reads nothing else, so the row figures are
    computed for those runs only (SQLite computes a row's columns before it sorts, PostgreSQL may too)."""
    page = runs_filtered(visible=visible, filters=filters).values("id")[:limit]
    return runs_annotated(Run.objects.filter(id__in=page), pending_approvals=pending_approvals).order_by("-id")


def run_row(run_id: int, *, pending_approvals: QuerySet) -> Run | None:
    """One run with its row figures (a live update of the list), or None. One query."""
    return runs_annotated(Run.objects.filter(id=run_id), pending_approvals=pending_approvals).first()
