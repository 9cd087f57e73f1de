"""Reads, with their related rows loaded up front. Who may read what is decided by tenancy.access."""

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Prefetch, Q

from agents.models import Workflow
from agents.versions import WorkflowSettings, workflow_config, workflow_settings
from core import sql
from core.circuit import BreakerRef, parked_by, parked_prefix
from core.errors import NotFound
from policy.verdicts import RunFacts
from runs.models import Run, Task


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


# Hand-written: the gate asks at every tool call, and the ORM's compiling of this query costs the worker
# more CPU than the database's work (docs/architecture.md, "Hand-written SQL on the hot path").
_FACTS_SQL = (
    "SELECT r.project_id, p.slug, r.workflow_id, w.slug, w.tool_policies, r.started_by_id, r.versions, "
    "EXISTS (SELECT 1 FROM approvals_approvalpolicy a WHERE a.enabled AND a.effect = 'require' "
    "AND (a.tool = %s OR a.tool = '') AND (a.project_id IS NULL OR a.project_id = r.project_id) "
    "AND (a.workflow_id IS NULL OR a.workflow_id = r.workflow_id)), "
    "EXISTS (SELECT 1 FROM approvals_approvalpolicy a WHERE a.enabled AND a.effect = 'waive' "
    "AND (a.tool = %s OR a.tool = '') AND a.project_id = r.project_id "
    "AND (a.workflow_id IS NULL OR a.workflow_id = r.workflow_id)) "
    "FROM runs_run r JOIN approvals_project p ON p.id = r.project_id JOIN agents_workflow w ON w.id = r.workflow_id "
    "LEFT JOIN agents_workflowversion v ON v.id = r.workflow_version_id "
    "WHERE r.id = %s"
)


def run_gate_facts(run_id: int, tool: str) -> RunFacts:
    """What the gate judges a call of ``tool`` in this run by (policy/verdicts.py): its project and
    workflow, the tool policies of the version it started with (a run without a version, rows written
    around the services, reads its workflow's), its starter, the approval policies it recorded at its
    start, and whether a live policy (or a waiver) might match the tool at all, so that the policies
    themselves are loaded only when one might. One statement: the gate is asked at every call. The broker
    asks through core.hooks.RUN_GATE_FACTS; the engine's own callers call it directly."""
    statement = _FACTS_SQL.replace("w.tool_policies", sql.pinned("v.config", "tool_policies", "w.tool_policies"))
    row = sql.fetchone(statement, [tool, tool, run_id])
    if row is None:
        raise NotFound(f"run {run_id} does not exist")
    project_id, project, workflow_id, workflow, policies, started_by, versions, may_match, may_waive = row
    policies, versions = sql.loads(policies), sql.loads(versions)
    recorded = versions.get("policies") if isinstance(versions, dict) else None
    return RunFacts(
        run_id,
        project_id,
        project,
        workflow_id,
        workflow,
        policies if isinstance(policies, dict) else {},
        started_by,
        recorded if isinstance(recorded, list) else None,
        policies_may_match=bool(may_match),
        waivers_may_match=bool(may_waive),
    )


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
