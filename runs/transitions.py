"""The run and task state machines: one table each (core/machine.py applies them)."""

from core.machine import StateMachine, TransitionNotAllowed

from .models import Run, Task

__all__ = ["RUN", "TASK", "RUN_TRANSITIONS", "TASK_TRANSITIONS", "TransitionNotAllowed"]

RS, TS = Run.Status, Task.Status

RUN_TRANSITIONS: dict[str, frozenset[str]] = {
    RS.PENDING: frozenset({RS.RUNNING, RS.CANCELLED, RS.FAILED}),
    RS.RUNNING: frozenset({RS.WAITING_FOR_APPROVAL, RS.NEEDS_ATTENTION, RS.CANCELLING, RS.COMPLETED, RS.FAILED}),
    RS.WAITING_FOR_APPROVAL: frozenset({RS.RUNNING, RS.NEEDS_ATTENTION, RS.CANCELLING}),
    RS.NEEDS_ATTENTION: frozenset({RS.RUNNING, RS.CANCELLING, RS.COMPENSATING, RS.FAILED}),
    RS.CANCELLING: frozenset({RS.CANCELLED}),
    RS.COMPENSATING: frozenset({RS.COMPENSATED, RS.NEEDS_ATTENTION}),
    RS.COMPLETED: frozenset(),
    # A finished run whose effects an operator wants undone can still be compensated.
    RS.FAILED: frozenset({RS.COMPENSATING}),
    RS.CANCELLED: frozenset({RS.COMPENSATING}),
    RS.COMPENSATED: frozenset(),
}

TASK_TRANSITIONS: dict[str, frozenset[str]] = {
    # pending/ready -> superseded: a re-plan replaced the plan of a task that had not started
    TS.PENDING: frozenset({TS.READY, TS.CANCELLED, TS.SUPERSEDED}),
    TS.READY: frozenset({TS.RUNNING, TS.FAILED, TS.CANCELLED, TS.SUPERSEDED}),
    # running -> ready: a lease expired (crash) or the attempt handed its rest to a fresh message
    # running -> running: a new holder claims a task whose lease expired (under a new fencing token)
    TS.RUNNING: frozenset(
        {TS.RUNNING, TS.COMPLETED, TS.RETRY_WAIT, TS.READY, TS.FAILED, TS.CANCELLED, TS.WAITING_FOR_APPROVAL}
    ),
    TS.RETRY_WAIT: frozenset({TS.RUNNING, TS.READY, TS.FAILED, TS.CANCELLED}),
    TS.WAITING_FOR_APPROVAL: frozenset({TS.READY, TS.FAILED, TS.CANCELLED}),
    TS.FAILED: frozenset({TS.READY}),  # an operator's retry
    TS.COMPLETED: frozenset(),
    TS.CANCELLED: frozenset(),
    TS.SUPERSEDED: frozenset(),
}


RUN = StateMachine("run", Run.Status.values, RUN_TRANSITIONS)
TASK = StateMachine("task", Task.Status.values, TASK_TRANSITIONS)
