"""The approval request's state machine (core/machine.py applies it): one decision, then it is closed."""

from core.machine import StateMachine

from .models import ApprovalRequest

AS = ApprovalRequest.Status

APPROVAL_TRANSITIONS: dict[str, frozenset[str]] = {
    AS.PENDING: frozenset({AS.APPROVED, AS.REJECTED, AS.WITHDRAWN, AS.EXPIRED}),
    AS.APPROVED: frozenset(),
    AS.REJECTED: frozenset(),
    AS.WITHDRAWN: frozenset(),
    AS.EXPIRED: frozenset(),
}

APPROVAL_REQUEST = StateMachine("approval request", AS.values, APPROVAL_TRANSITIONS)
