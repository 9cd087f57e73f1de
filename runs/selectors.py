"""Reads, with their related rows loaded up front. Who may read what is decided by tenancy.access."""

from django.db.models import Prefetch, Q

from core.errors import NotFound

from .models import Run, Task


def set_aside_by_replan(plan_version) -> Q:
    """Tasks a re-plan set aside (runs/services/replan.py): superseded, or failed under a plan older than
    ``plan_version`` — the run's, as an int, an F() or an OuterRef(). They are not the run's work."""
    return Q(status=Task.Status.SUPERSEDED) | Q(status=Task.Status.FAILED, plan_version__lt=plan_version)


def run_get(*, run_id: int) -> Run:
    """A run with its workflow and its tasks (with their agents): three queries in all."""
    tasks = Prefetch("tasks", queryset=Task.objects.select_related("agent").order_by("id"))
    try:
        return Run.objects.select_related("workflow", "project").prefetch_related(tasks).get(id=run_id)
    except Run.DoesNotExist:
        raise NotFound(f"run {run_id} does not exist") from None
