"""Each "may I?" rule of the run actions, written once.

A ``<service>_refusal`` is pure: it reads the facts it is given (a run, a task, what its caller counted)
and returns the error the service raises, or None. The service calls it under its lock; the confirmation
pages, the run page's buttons, the bulk preview and the API call the same function, so what they offer
is what the service does (tests/runs/test_refusals.py drives every action through both).
The compensation's and the resolution's rules live beside their services, in saga/compensation.py.
"""

from core.errors import Conflict, InvalidInput, WardenError

from .models import Run, Task
from .transitions import RUN

# No worker claims a task of such a run: a retried task would sit ready for good.
NO_RETRY_WHILE = frozenset({Run.Status.CANCELLING, Run.Status.COMPENSATING})


def run_cancel_refusal(run: Run) -> WardenError | None:
    """A run is cancelled from any state the table lets reach cancelling (or, not started, cancelled)."""
    if RUN.allowed(run.status, Run.Status.CANCELLING) or run.status == Run.Status.PENDING:
        return None
    why = {Run.Status.CANCELLING: "already being cancelled", Run.Status.COMPENSATING: "being compensated"}.get(
        run.status, "already finished"
    )
    return Conflict(f"run {run.id} is {run.status}; it cannot be cancelled ({why})")


def run_resume_refusal(run: Run) -> WardenError | None:
    # A run waiting for approval moves on when the reviewers decide, not on an operator's resume.
    if run.status == Run.Status.NEEDS_ATTENTION:
        return None
    return Conflict(f"run {run.id} is {run.status}; only a run that needs attention can be resumed")


def task_retry_refusal(
    run: Run, task: Task, *, step: int | None = None, last: int = 0, unresolved=(), repeat=(), repeatable=()
) -> WardenError | None:
    """A failed task of the current plan, in a run that is not finished, cancelling or compensating; from
    ``step`` (None: a plain retry): a step of its journal (``last`` is its last), with no operation of
    unknown outcome (``unresolved``) at or after it; the steps whose committed effect is to happen again
    (``repeat``) among those at or after it that have one (``repeatable``)."""
    if run.is_terminal:
        return Conflict(f"run {run.id} is {run.status}; a task of a finished run cannot be retried")
    if task.status != Task.Status.FAILED:
        return Conflict(f"task {task.key} is {task.status}; only a failed task can be retried")
    if run.status in NO_RETRY_WHILE:
        return Conflict(f"run {run.id} is {run.status}; its tasks cannot be retried now")
    if task.plan_version < run.plan_version:
        return Conflict(
            f"task {task.key} belongs to plan {task.plan_version}, which plan {run.plan_version} replaced; "
            "retry a task of the current plan"
        )
    if step is None:
        if repeat:
            return InvalidInput(
                "only a retry from a step repeats effects", [{"field": "repeat", "message": "needs from_step"}]
            )
        return None
    if not 1 <= step <= last + 1:
        message = (
            f"task {task.key} has journaled steps 1 to {last}: a retry may start from step 1 to {last + 1}, not {step}"
        )
        return InvalidInput(message, [{"field": "step", "message": f"between 1 and {last + 1}"}])
    if unresolved:
        listed = ", ".join(f"{op.id} ({op.tool}, {op.status})" for op in unresolved)
        return Conflict(
            f"operations {listed} may or may not have happened: resolve them before executing their steps afresh"
        )
    strays = sorted(set(repeat) - set(repeatable))
    if strays:
        offered = ", ".join(map(str, sorted(repeatable))) or "none"
        return InvalidInput(
            f"steps {', '.join(map(str, strays))} have no committed effect at or after step {step} to repeat "
            f"(those that do: {offered})",
            [{"field": "repeat", "message": f"steps among: {offered}"}],
        )
    return None


# A fork copies a journal and a ledger that must stand still: no worker may be writing them.
UNSETTLED = frozenset({Run.Status.PENDING, Run.Status.RUNNING, Run.Status.WAITING_FOR_APPROVAL, Run.Status.CANCELLING})


def run_fork_state_refusal(run: Run, *, running=(), external=False) -> WardenError | None:
    """The run's side of run_fork_refusal (the run page offers "Fork" by it): settled, not undone, whole."""
    if external:
        return Conflict(f"run {run.id} is an external agent's: its steps run elsewhere and cannot be forked")
    if run.mode != Run.Mode.LIVE:  # a live fork would take its stand-in answers for effects that happened
        return Conflict(
            f"run {run.id} is a replay: its calls were answered from its original's ledger or stood in for, never "
            "made; fork the original, or replay it again"
        )
    if run.status in UNSETTLED or running:
        what = f"{run.status}" + (f" (tasks {', '.join(running)} running)" if running else "")
        return Conflict(f"run {run.id} is {what}; fork a settled run: finished, or needing attention")
    if run.status in (Run.Status.COMPENSATING, Run.Status.COMPENSATED):
        return Conflict(f"run {run.id} is {run.status}; its effects were undone, so none can be inherited")
    if run.pruned_at is not None:
        return Conflict(f"run {run.id}'s journal was pruned by retention; there is nothing to replay")
    return None


def run_fork_refusal(
    run: Run, task: Task | None, *, task_key: str, step: int, last: int, running=(), unresolved=(), external=False
) -> WardenError | None:
    """A fork starts from a settled run (finished, or needing attention, with no attempt under way) whose
    effects were not undone and whose journal is whole; at a task of its current plan that is not a
    planner's (its plan would be made twice), from a step of its journal: 1 to ``last`` + 1 (``last`` for a
    completed task, whose last step is its answer); with no operation of the run of unknown outcome."""
    # The caller's input first: a wrong task or step is a 422 whatever the run's state.
    if task is None:
        return InvalidInput(f"run {run.id} has no task {task_key!r}", [{"field": "task", "message": "no such task"}])
    top = last if task.status == Task.Status.COMPLETED else last + 1
    if not 1 <= step <= top:
        return InvalidInput(
            f"task {task.key} has journaled steps 1 to {last}: a fork may start from step 1 to {top}, not {step}",
            [{"field": "step", "message": f"between 1 and {top}"}],
        )
    refused = run_fork_state_refusal(run, running=running, external=external)
    if refused is not None:
        return refused
    if task.plan_version < run.plan_version:
        return Conflict(
            f"task {task.key} belongs to plan {task.plan_version}, which plan {run.plan_version} replaced; "
            "fork a task of the current plan"
        )
    if task.agent_id and task.agent.is_planner:
        return Conflict(f"task {task.key} is a planner's: fork one of the tasks it planned")
    if unresolved:
        listed = ", ".join(f"{op.id} ({op.tool}, {op.status})" for op in unresolved)
        return Conflict(f"operations {listed} may or may not have happened: resolve them before forking the run")
    return None


def run_retry_failed_refusal(run: Run, failed: list[Task]) -> WardenError | None:
    """The bulk action "retry failed tasks": each failed task of the current plan, if every one may be."""
    if not failed:
        if run.is_terminal:
            return Conflict(f"run {run.id} is {run.status}; a task of a finished run cannot be retried")
        return Conflict(f"run {run.id} is {run.status}; no failed task")
    for task in failed:
        refused = task_retry_refusal(run, task)
        if refused is not None:
            return refused
    return None


def short(refusal: WardenError, run: Run) -> str:
    """A refusal without its run's name, for lists that group runs by why they were skipped."""
    return str(refusal).removeprefix(f"run {run.id} is {run.status}; ")
