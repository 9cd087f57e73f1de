"""Waking a task parked on a person (a reviewer's decision, an answer to its question)."""

from runs.models import Run, Task
from runs.services.runs import run_transition, task_set_ready


def parked_task_wake(run: Run, task_id: int, reason: str, now) -> bool:
    """Send a task that waits for a person back to work. Run locked; True when it was parked."""
    task = Task.objects.select_for_update().filter(id=task_id).first()
    if task is None or task.status != Task.Status.WAITING_FOR_APPROVAL:
        return False  # still running: it sees the outcome when it checks before parking
    if run.status == Run.Status.WAITING_FOR_APPROVAL:
        run_transition(run=run, to=Run.Status.RUNNING, reason=reason, now=now)
    task_set_ready(task=task, now=now)  # sends it; a run paused for a human holds it until resumed
    return True
