"""Plans held for a reviewer (a workflow's ``approve_plans``): a planner's plan becomes tasks only once
approved. Rejected, the planner plans again with the reviewer's comment in its objective. The approvals
app decides (approvals/services.py); these are the engine's halves, called with the run locked."""

from django.conf import settings

from agents.models import Agent
from agents.planning import plan_validate
from core import bus, hooks
from core.errors import Conflict

from ..models import Run, Span, Task
from ..schemas import PLAN_OUTPUT_SCHEMA, PlannedTaskIn
from ..selectors import run_workflow_settings
from .outbox import outbox_add
from .replan import DEAD, replan_key
from .runs import run_transition, tasks_create


def plan_check(run: Run, plan) -> tuple[list[PlannedTaskIn], dict[str, Agent]]:
    """A planner's plan validated against the run as it now is (raises InvalidInput)."""
    existing = dict(Task.objects.filter(run_id=run.id).values_list("key", "status"))
    wf = run_workflow_settings(run.id)  # the agents and the limit of the version the run started with
    return plan_validate(
        plan,
        max_tasks=wf.max_tasks or settings.WARDEN["MAX_TASKS_PER_RUN"],
        existing_keys=frozenset(existing),
        dead_keys=frozenset(k for k, status in existing.items() if status in DEAD),
        max_fanout=settings.WARDEN["MAX_PLAN_FANOUT"],
        allowed_agents=frozenset(wf.agents),
    )


def plan_held(run: Run, task: Task, plan, now) -> bool:
    """True when the workflow holds plans: the plan now waits for a reviewer and the run with it."""
    if not run_workflow_settings(run.id).approve_plans:  # ``run`` may be a partial row
        return False
    hooks.call(hooks.PLAN_HOLD, run=run, task=task, plan=plan, now=now)
    if run.status == Run.Status.RUNNING:
        run_transition(
            run=run, to=Run.Status.WAITING_FOR_APPROVAL, reason=f"plan {run.plan_version} waits for a reviewer", now=now
        )
    return True


def workers_started(run: Run) -> bool:
    """Has any task other than a planner's started? Then a held plan may be approved or rejected, not edited."""
    return Task.objects.filter(run_id=run.id, started_at__isnull=False, agent__is_planner=False).exists()


def plan_release(*, run: Run, task: Task, plan, reason: str, now) -> list[Task]:
    """The approved plan becomes tasks; the ready ones are sent and the run goes on."""
    if run.status not in (Run.Status.WAITING_FOR_APPROVAL, Run.Status.RUNNING):
        raise Conflict(f"run {run.id} is {run.status}: its plan can no longer start")
    planned, agents = plan_check(run, plan)
    created = tasks_create(run=run, planned=planned, agents=agents, depth=task.depth + 1, now=now)
    if run.status == Run.Status.WAITING_FOR_APPROVAL:
        run_transition(run=run, to=Run.Status.RUNNING, reason=reason, now=now)
    for t in created:
        if t.status == Task.Status.READY:
            outbox_add(actor="execute_task", kwargs={"run_id": run.id, "task_id": t.id})
    bus.run_changed(run.id)
    return created


def plan_rejected(*, run: Run, task: Task, note: str, now) -> Task:
    """The planner plans again: a new planner task whose objective carries the reviewer's comment."""
    planner = Agent.objects.get(id=task.agent_id)
    run.plan_version += 1
    Run.objects.filter(id=run.id).update(plan_version=run.plan_version)
    objective = (
        f"{task.objective}\n\nA reviewer rejected your previous plan, with this comment: {note[:2000]}\n"
        "Plan again, taking the comment into account."
    )
    [again] = tasks_create(
        run=run,
        planned=[PlannedTaskIn(key=replan_key(run.plan_version), agent=planner.slug, objective=objective)],
        agents={planner.slug: planner},
        depth=task.depth,
        now=now,
    )
    again.output_schema = PLAN_OUTPUT_SCHEMA
    again.save(update_fields=["output_schema"])
    outbox_add(actor="execute_task", kwargs={"run_id": run.id, "task_id": again.id})
    Span.objects.create(
        run_id=run.id, task_id=task.id, kind=Span.Kind.PLAN, name=f"plan {run.plan_version - 1} rejected",
        status=Span.Status.OK, started_at=now, ended_at=now,
        attributes={"plan_version": run.plan_version, "note": note[:2000], "planner_task": again.key},
    )  # fmt: skip
    if run.status == Run.Status.WAITING_FOR_APPROVAL:
        run_transition(
            run=run,
            to=Run.Status.RUNNING,
            reason=f"re-planning after a reviewer rejected plan {run.plan_version - 1}",
            now=now,
        )
    bus.run_changed(run.id)
    return again
