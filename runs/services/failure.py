"""A task fails for good: its run is re-planned around it, or handed to a human. Reached from every way an
attempt can end badly (a lease that cannot start it, its attempt's failure, the sweeper's expiry)."""

from core import bus

from ..models import Run, Span, Task
from ..transitions import TASK
from .replan import NO_REPLANNING, replan
from .runs import run_transition


def fail_task(*, task: Task, run: Run, failure_class: str, reason: str, now) -> None:
    """Fail a task for good and hand its run to a human. Call with the run (and task) locked."""
    TASK.move(
        task,
        Task.Status.FAILED,
        failure_class=failure_class,
        status_reason=reason[:4000],
        finished_at=now,
        lease_owner="",
        lease_expires_at=None,
    )
    bus.run_changed(run.id)
    Span.objects.filter(task=task, kind=Span.Kind.TASK, ended_at__isnull=True).update(
        ended_at=now, status=Span.Status.ERROR, attributes={"error": reason[:2000]}
    )
    if run.status in (Run.Status.RUNNING, Run.Status.WAITING_FOR_APPROVAL):
        why_not = replan(run=run, task=task, failure_class=failure_class, reason=reason, now=now)
        if not why_not:
            return
        what = reason if failure_class == "budget" else f"task {task.key} failed ({failure_class}): {reason}"
        if why_not != NO_REPLANNING:
            what += f" (not re-planned: {why_not})"
        run_transition(run=run, to=Run.Status.NEEDS_ATTENTION, reason=what, now=now)
