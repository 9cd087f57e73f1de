"""The run and task state machines: allowed paths, forbidden paths, replays."""

import pytest
from django.db import transaction

from core.errors import Conflict
from runs.models import Run, Task
from runs.services import run_cancel, run_resume, run_start, run_transition, task_retry
from runs.transitions import RUN_TRANSITIONS, TASK, TASK_TRANSITIONS, TransitionNotAllowed


def _to(run, status, reason="test"):
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(id=run.id)
        return run_transition(run=locked, to=status, reason=reason)


def test_every_status_has_a_row_and_terminal_states_lead_nowhere():
    assert set(RUN_TRANSITIONS) == set(Run.Status.values)
    assert set(TASK_TRANSITIONS) == set(Task.Status.values)
    # A finished run leads nowhere, except that a failed or cancelled one may still be compensated.
    assert all(RUN_TRANSITIONS[s] <= {Run.Status.COMPENSATING} for s in Run.TERMINAL)
    assert not RUN_TRANSITIONS[Run.Status.COMPENSATED] and not RUN_TRANSITIONS[Run.Status.COMPLETED]
    assert not TASK_TRANSITIONS[Task.Status.COMPLETED]


def test_allowed_path_needs_attention_then_resume(demo):
    run = run_start(workflow="deploy-review")
    _to(run, Run.Status.NEEDS_ATTENTION, "task failed")
    resumed = run_resume(run_id=run.id)
    assert resumed.status == Run.Status.RUNNING


def test_illegal_transition_is_refused_with_a_named_error_and_changes_nothing(demo):
    run = run_start(workflow="deploy-review")
    _to(run, Run.Status.COMPLETED)
    with pytest.raises(TransitionNotAllowed, match="run cannot go from completed to running"):
        _to(run, Run.Status.RUNNING)
    with pytest.raises(Conflict, match="it cannot be cancelled"):
        run_cancel(run_id=run.id)
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED
    with pytest.raises(TransitionNotAllowed, match="task cannot go from completed to running"):
        TASK.check(Task.Status.COMPLETED, Task.Status.RUNNING)


def test_replayed_transition_is_refused(demo):
    run = run_start(workflow="deploy-review")
    run_cancel(run_id=run.id)
    with pytest.raises(Conflict, match="is cancelled; it cannot be cancelled"):
        run_cancel(run_id=run.id)


def test_cancel_of_an_idle_run_cancels_its_queued_tasks_at_once(demo):
    run = run_start(workflow="deploy-review")
    cancelled = run_cancel(run_id=run.id)
    assert cancelled.status == Run.Status.CANCELLED
    assert set(run.tasks.values_list("status", flat=True)) == {Task.Status.CANCELLED}


def test_a_task_of_a_finished_run_cannot_be_retried(demo):
    run = run_start(workflow="deploy-review")
    run_cancel(run_id=run.id)
    with pytest.raises(Conflict):
        task_retry(task_id=run.tasks.first().id)
