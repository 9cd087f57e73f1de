"""Re-planning after a task's quality failure (seed 001: "replan quality failures").

When a task of a planner-agent run fails for good with an invalid output, a loop or a permanent error,
and the workflow allows another plan (``Workflow.max_replans``), the run is not handed to a human yet:

- the run's ``plan_version`` goes up by one;
- every task of the old plan that had not started (pending or ready, no attempt yet) is superseded;
  tasks already at work go on, and their results count;
- a new planner task, ``replan-<version>``, is created ready. Its prompt carries the world as it is
  when it runs (``world_state``): every task and its status, the artifacts, and the side-effect ledger,
  so the new plan does not redo what already happened (seed 000: never re-plan on stale context).

Failures a new plan cannot route around still go to a human: budgets, policy refusals, ambiguous
writes, an open provider breaker, crashes. A failing planner is never re-planned (no loop of plans).
"""

import json

from agents.models import Agent, Workflow
from agents.versions import WorkflowSettings
from core import bus
from tools.models import ToolOperation

from ..models import Artifact, Run, Span, Task
from ..schemas import PLAN_OUTPUT_SCHEMA, PlannedTaskIn
from ..selectors import run_workflow_settings
from ..transitions import TASK
from .outbox import outbox_add
from .runs import run_transition, tasks_create

REPLANNABLE = frozenset({Task.FailureClass.VALIDATION, Task.FailureClass.LOOP, Task.FailureClass.PERMANENT})
NOT_STARTED = (Task.Status.PENDING, Task.Status.READY)
# Dependencies a new plan may name: tasks that completed or are still at work.
DEAD = (Task.Status.FAILED, Task.Status.CANCELLED, Task.Status.SUPERSEDED)
WORLD_OPERATIONS_SHOWN = 60
PREVIEW_CHARS = 240


def replan_key(version: int) -> str:
    return f"replan-{version}"


NO_REPLANNING = "the workflow does not re-plan"


def _refusal(run: Run, task: Task, failure_class: str, wf: WorkflowSettings) -> str:
    """Why this failure does not go back to the planner ('' when it does). ``wf``: the settings of the
    workflow's version the run started with."""
    if wf.planner != Workflow.Planner.AGENT or not wf.planner_agent or not wf.max_replans:
        return NO_REPLANNING
    if failure_class not in REPLANNABLE:
        return f"a {failure_class} failure is for a human, not a new plan"
    if Agent.objects.filter(id=task.agent_id, is_planner=True).exists():
        return "the planner itself failed"
    if run.plan_version - 1 >= wf.max_replans:
        return f"the workflow allows {wf.max_replans} re-plan(s) and they are used"
    return ""


def _supersede_unstarted(run: Run, *, why: str, now) -> list[str]:
    """The tasks of the old plan that never started are set aside; their keys."""
    superseded = list(
        Task.objects.filter(run_id=run.id, status__in=NOT_STARTED, attempts=0).values_list("key", flat=True)
    )
    TASK.move_where(
        Task.objects.filter(run_id=run.id, key__in=superseded),
        Task.Status.SUPERSEDED,
        sources=NOT_STARTED,
        status_reason=why,
        finished_at=now,
        ready_at=None,
    )
    return superseded


def replan(*, run: Run, task: Task, failure_class: str, reason: str, now) -> str:
    """Send the run back to its planner after ``task`` failed for good. Returns '' when it did, else
    why not (NO_REPLANNING when the workflow never re-plans). Call with the run (and task) locked,
    after the task is marked failed."""
    wf = run_workflow_settings(run.id)  # as the run started, not as edited since
    why_not = _refusal(run, task, failure_class, wf)
    if why_not:
        return why_not
    planner = Agent.objects.get(slug=wf.planner_agent)
    run.plan_version += 1  # the run is locked: its row is current
    Run.objects.filter(id=run.id).update(plan_version=run.plan_version)
    why = f"superseded by plan {run.plan_version}: task {task.key} failed"
    superseded = _supersede_unstarted(run, why=why, now=now)
    objective = (
        f"Re-plan{': ' + run.goal if run.goal else ''}\nTask {task.key} failed ({failure_class}): {reason[:1000]}\n"
        "Plan only the work that is left. The world state below is what has already happened: tasks, "
        "their artifacts and every side effect in the ledger. Do not plan again what is done; new tasks "
        "may depend on tasks that completed or are still at work."
    )
    [planner_task] = tasks_create(
        run=run,
        planned=[PlannedTaskIn(key=replan_key(run.plan_version), agent=planner.slug, objective=objective)],
        agents={planner.slug: planner},
        depth=0,
        now=now,
    )
    planner_task.output_schema = PLAN_OUTPUT_SCHEMA
    planner_task.save(update_fields=["output_schema"])
    outbox_add(actor="execute_task", kwargs={"run_id": run.id, "task_id": planner_task.id})
    Span.objects.create(
        run_id=run.id,
        task_id=task.id,
        kind=Span.Kind.PLAN,
        name=f"re-plan {run.plan_version}",
        status=Span.Status.OK,
        started_at=now,
        ended_at=now,
        attributes={
            "plan_version": run.plan_version,
            "failed_task": task.key,
            "failure_class": failure_class,
            "reason": reason[:2000],
            "superseded": superseded,
            "planner_task": planner_task.key,
        },
    )
    note = f"re-planning (plan {run.plan_version}) after task {task.key} failed ({failure_class})"
    if run.status == Run.Status.WAITING_FOR_APPROVAL:
        run_transition(run=run, to=Run.Status.RUNNING, reason=note, now=now)
    else:
        Run.objects.filter(id=run.id).update(status_reason=note)
        run.status_reason = note
    bus.run_changed(run.id)
    return ""


def _preview(value) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"


def world_state(run_id: int, *, exclude_task: int | None = None) -> dict:
    """What a re-planner must know, read when its attempt starts: each task with its status (and why
    it failed), each task's latest artifact in short, and the ledger's side effects (redacted
    arguments, as stored), newest last."""

    tasks = list(
        Task.objects.filter(run_id=run_id)
        .exclude(id=exclude_task)
        .order_by("id")
        .values("id", "key", "agent__slug", "status", "status_reason", "failure_class", "plan_version")
    )
    artifacts = {}
    for artifact in Artifact.objects.filter(run_id=run_id).order_by("version").values("task_id", "version", "content"):
        artifacts[artifact["task_id"]] = artifact
    keys = {t["id"]: t["key"] for t in tasks}
    ops = list(
        ToolOperation.objects.filter(run_id=run_id)
        .order_by("-id")
        .values("id", "task_id", "tool", "kind", "status", "external_id", "arguments")[:WORLD_OPERATIONS_SHOWN]
    )[::-1]
    total_ops = ToolOperation.objects.filter(run_id=run_id).count()
    return {
        "tasks": [
            {
                "key": t["key"],
                "agent": t["agent__slug"],
                "status": t["status"],
                "plan_version": t["plan_version"],
                "why": t["status_reason"][:300] if t["status"] in DEAD else "",
                "failure_class": t["failure_class"] if t["status"] == Task.Status.FAILED else "",
                "artifact": artifacts[t["id"]]["content"] if t["id"] in artifacts else None,
            }
            for t in tasks
        ],
        "operations": [
            {
                "id": op["id"],
                "task": keys.get(op["task_id"], ""),
                "tool": op["tool"],
                "kind": op["kind"],
                "status": op["status"],
                "external_id": op["external_id"],
                "arguments": op["arguments"],
            }
            for op in ops
        ],
        "operations_total": total_ops,
    }


def world_lines(world: dict) -> list[str]:
    """The world state as prompt lines, one per side effect (oldest first) and then one per task: when
    the context budget is short, the prompt drops the oldest side effects first (agents/prompts.py)."""
    lines = ["World state (as of this attempt):"]
    shown = len(world["operations"])
    if world["operations_total"] > shown:
        lines.append(f"- ({world['operations_total'] - shown} older side effects not shown)")
    for op in world["operations"]:
        external = f", external id {op['external_id']}" if op["external_id"] else ""
        lines.append(
            f"- side effect {op['id']}: {op['tool']} by {op['task'] or 'the run'} ({op['kind']}): "
            f"{op['status']}{external}; arguments {_preview(op['arguments'])}"
        )
    if not world["operations"]:
        lines.append("- no side effects so far")
    for t in world["tasks"]:
        line = f"- task {t['key']} ({t['agent']}, plan {t['plan_version']}): {t['status']}"
        if t["failure_class"]:
            line += f" ({t['failure_class']})"
        if t["why"]:
            line += f": {t['why']}"
        if t["artifact"] is not None:
            line += f"; artifact {_preview(t['artifact'])}"
        lines.append(line)
    return lines
