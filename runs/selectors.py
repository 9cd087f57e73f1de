"""Reads, with their related rows loaded up front. Who may read what is decided by approvals.access."""

from django.db.models import Prefetch

from .errors import NotFound
from .models import Run, Task


def run_get(*, run_id: int) -> Run:
    """A run with its workflow and its tasks (with their agents): three queries in all."""
    tasks = Prefetch("tasks", queryset=Task.objects.select_related("agent").order_by("id"))
    try:
        return Run.objects.select_related("workflow", "project").prefetch_related(tasks).get(id=run_id)
    except Run.DoesNotExist:
        raise NotFound(f"run {run_id} does not exist") from None
