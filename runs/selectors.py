"""Reads, with their related rows loaded up front. Who may read what is decided by tenancy.access."""

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Prefetch, Q

from agents.models import Workflow
from agents.versions import WorkflowSettings, workflow_config, workflow_settings
from core.circuit import BreakerRef, parked_by, parked_prefix
from core.errors import NotFound

from .models import Run, Task


def set_aside_by_replan(plan_version) -> Q:
    """Tasks a re-plan set aside (runs/services/replan.py): superseded, or failed under a plan older than
    ``plan_version`` — the run's, as an int, an F() or an OuterRef(). They are not the run's work."""
    return Q(status=Task.Status.SUPERSEDED) | Q(status=Task.Status.FAILED, plan_version__lt=plan_version)


def run_workflow_settings(run: Run | int) -> WorkflowSettings:
    """The workflow's settings a run keeps to its end: those of the version it started with (its plan,
    tool policies, re-plans, plan approval, compensation), whatever was edited since. Every reader in
    the engine asks here, never the workflow's row. ``run``: a Run (its ``workflow_version`` loaded
    when already at hand) or a run id. One query at most."""
    run_id = run if isinstance(run, int) else run.id
    loaded = None if isinstance(run, int) else run._state.fields_cache.get("workflow_version")
    if loaded is not None:
        return workflow_settings(loaded.config)
    config, workflow_id = Run.objects.filter(id=run_id).values_list("workflow_version__config", "workflow_id").get()
    if config is None:  # a run the upgrade's backfill did not reach: its workflow as it is (the old reading)
        return workflow_settings(workflow_config(Workflow.objects.select_related("planner_agent").get(id=workflow_id)))
    return workflow_settings(config)


def run_get(*, run_id: int) -> Run:
    """A run with its workflow (and the version it started with) and its tasks (with their agents): three
    queries in all."""
    tasks = Prefetch("tasks", queryset=Task.objects.select_related("agent").order_by("id"))
    try:
        return (
            Run.objects.select_related("workflow", "workflow_version", "project").prefetch_related(tasks).get(id=run_id)
        )
    except Run.DoesNotExist:
        raise NotFound(f"run {run_id} does not exist") from None


@dataclass(frozen=True)
class ParkedTask:
    task_id: int
    run_id: int
    project_id: int
    key: str
    since: datetime | None


def breakers_parked(
    *, project_ids: list[int] | None = None, breaker: BreakerRef | None = None
) -> dict[BreakerRef, list[ParkedTask]]:
    """The tasks each breaker parked, oldest first: failed because it refused their call, in a run that
    needs attention, not retried since. ``project_ids``: of those projects' runs only (None: every one);
    ``breaker``: that breaker's only (of its project, for a project's own tool). One query."""
    rows = Task.objects.filter(
        status=Task.Status.FAILED,
        failure_class__in=[Task.FailureClass.BREAKER, Task.FailureClass.PROVIDER],
        run__status=Run.Status.NEEDS_ATTENTION,
    )
    if project_ids is not None:
        rows = rows.filter(run__project_id__in=project_ids)
    if breaker is not None:
        rows = rows.filter(status_reason__startswith=parked_prefix(breaker))
        if breaker.project_id is not None:
            rows = rows.filter(run__project_id=breaker.project_id)
    found: dict[BreakerRef, list[ParkedTask]] = {}
    fields = ("id", "run_id", "run__project_id", "key", "status_reason", "finished_at")
    for task_id, run_id, project_id, key, reason, since in rows.order_by("finished_at", "id").values_list(*fields):
        ref = parked_by(reason, project_id=project_id)
        if ref is not None and (breaker is None or ref == breaker):
            found.setdefault(ref, []).append(ParkedTask(task_id, run_id, project_id, key, since))
    return found
