"""The question's state machine (core/machine.py applies it): one answer, then it is closed. The approval
request's is the policy app's (policy/transitions.py), re-exported here for the reviewer's code."""

from core.machine import StateMachine
from policy.transitions import APPROVAL_REQUEST, APPROVAL_TRANSITIONS  # noqa: F401

from .models import Question

QS = Question.Status

QUESTION_TRANSITIONS: dict[str, frozenset[str]] = {
    QS.PENDING: frozenset({QS.ANSWERED, QS.EXPIRED, QS.WITHDRAWN}),
    QS.ANSWERED: frozenset(),
    QS.EXPIRED: frozenset(),
    QS.WITHDRAWN: frozenset(),
}

QUESTION = StateMachine("question", QS.values, QUESTION_TRANSITIONS)
