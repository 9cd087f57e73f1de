"""The trace's reads: light span rows, per-task totals summed by the database, ingested orphans. The run
page draws them (dashboard/trace.py), GET /api/v1/runs/{id}/spans lists them (api/reads.py)."""

from django.db.models import Count, Q, Sum

from agents.models import Workflow
from runs.models import Span

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
CONTAINERS = ("run", "task", "attempt")


def span_rows(run_id: int, **filters) -> list[dict]:
    return list(Span.objects.filter(run_id=run_id, **filters).order_by("id").values(*SPAN_FIELDS))


def orphan_ids(run) -> frozenset[int]:
    """The run's ingested spans whose parent has not been received (an external run's only: a query)."""
    if run.workflow.planner != Workflow.Planner.EXTERNAL:
        return frozenset()
    return frozenset(Span.objects.filter(run=run, attributes__has_key=Span.ORPHAN).values_list("id", flat=True))


def task_totals(run_id: int, task_ids: list[int] | None = None) -> dict[int, tuple[int, int, int, int]]:
    """Per task (of ``task_ids``, or all): tokens, cost, spans and failed spans of its whole subtree,
    summed by the database (a large run's page loads only its run, task and attempt spans)."""
    spans = Span.objects.filter(run_id=run_id, task_id__isnull=False)
    if task_ids is not None:
        spans = spans.filter(task_id__in=task_ids)
    rows = (
        spans.values("task_id")
        .annotate(
            tokens=Sum("tokens_in") + Sum("tokens_out"),
            cost=Sum("cost_micros"),
            spans=Count("id"),
            errors=Count("id", filter=Q(status=Span.Status.ERROR)),
        )
        .order_by()
    )
    return {r["task_id"]: (r["tokens"] or 0, r["cost"] or 0, r["spans"], r["errors"]) for r in rows}
