"""The run and task state machines: one table each, and the checks that apply them."""

from .models import Run, Task

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
    TS.RUNNING: frozenset({TS.COMPLETED, TS.RETRY_WAIT, TS.READY, TS.FAILED, TS.CANCELLED, TS.WAITING_FOR_APPROVAL}),
    TS.RETRY_WAIT: frozenset({TS.RUNNING, TS.READY, TS.FAILED, TS.CANCELLED}),
    TS.WAITING_FOR_APPROVAL: frozenset({TS.READY, TS.FAILED, TS.CANCELLED}),
    TS.FAILED: frozenset({TS.READY}),  # an operator's retry
    TS.COMPLETED: frozenset(),
    TS.CANCELLED: frozenset(),
    TS.SUPERSEDED: frozenset(),
}


class TransitionNotAllowed(Exception):
    """A state machine refused a change; the message names the machine and both states."""

    def __init__(self, machine: str, current: str, to: str):
        self.machine, self.current, self.to = machine, current, to
        super().__init__(f"{machine} cannot go from {current} to {to}")


def check_run_transition(current: str, to: str) -> None:
    if to not in RUN_TRANSITIONS[current]:
        raise TransitionNotAllowed("run", current, to)


def check_task_transition(current: str, to: str) -> None:
    if to not in TASK_TRANSITIONS[current]:
        raise TransitionNotAllowed("task", current, to)
