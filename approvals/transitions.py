"""The approval request's and the question's state machines (core/machine.py applies them): one decision or
one answer, then it is closed."""

from core.machine import StateMachine

from .models import ApprovalRequest, Question

AS = ApprovalRequest.Status

APPROVAL_TRANSITIONS: dict[str, frozenset[str]] = {
    AS.PENDING: frozenset({AS.APPROVED, AS.REJECTED, AS.WITHDRAWN, AS.EXPIRED}),
    AS.APPROVED: frozenset(),
    AS.REJECTED: frozenset(),
    AS.WITHDRAWN: frozenset(),
    AS.EXPIRED: frozenset(),
}

APPROVAL_REQUEST = StateMachine("approval request", AS.values, APPROVAL_TRANSITIONS)

QS = Question.Status

QUESTION_TRANSITIONS: dict[str, frozenset[str]] = {
    QS.PENDING: frozenset({QS.ANSWERED, QS.EXPIRED, QS.WITHDRAWN}),
    QS.ANSWERED: frozenset(),
    QS.EXPIRED: frozenset(),
    QS.WITHDRAWN: frozenset(),
}

QUESTION = StateMachine("question", QS.values, QUESTION_TRANSITIONS)
