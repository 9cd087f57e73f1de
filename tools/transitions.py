"""The tool operation's state machine (core/machine.py applies it): an intent's life in the ledger."""

from core.machine import StateMachine

from .models import ToolOperation

OS = ToolOperation.Status

OPERATION_TRANSITIONS: dict[str, frozenset[str]] = {
    # propose mode: bundled for one approval at the end, or dropped when the run ends without it
    OS.PROPOSED: frozenset({OS.AWAITING_APPROVAL, OS.REJECTED}),
    OS.AWAITING_APPROVAL: frozenset({OS.APPROVED, OS.REJECTED}),
    # approved -> rejected: its approval no longer stands when the call is due, or the run moved on
    # approved -> awaiting_approval: its tool's declaration changed since; judged again, asked again
    OS.APPROVED: frozenset({OS.EXECUTING, OS.REJECTED, OS.AWAITING_APPROVAL}),
    # executing -> executing: a new holder of the task calls again under the same key (a crash)
    # executing -> approved: reconciled as not committed; called again with the same key
    # executing -> refused: the system said no and the model is told (on_refusal); nothing happened
    OS.EXECUTING: frozenset(
        {OS.EXECUTING, OS.COMMITTED, OS.REFUSED, OS.FAILED, OS.AMBIGUOUS, OS.APPROVED, OS.REJECTED}
    ),
    # ambiguous: reconciliation or an operator says whether it happened (ambiguous -> ambiguous: asked
    # again, still no answer; its reason says why)
    OS.AMBIGUOUS: frozenset({OS.AMBIGUOUS, OS.COMMITTED, OS.FAILED, OS.APPROVED, OS.EXECUTING}),
    # failed -> executing: a retry; failed -> approved: a compensation step tried again;
    # failed -> awaiting_approval: retried after its tool's declaration changed
    OS.FAILED: frozenset({OS.EXECUTING, OS.APPROVED, OS.REJECTED, OS.AWAITING_APPROVAL}),
    OS.COMMITTED: frozenset({OS.COMPENSATING}),
    # compensating -> committed: its correction was not sent, so the effect stands
    OS.COMPENSATING: frozenset({OS.COMPENSATED, OS.COMPENSATION_FAILED, OS.COMMITTED}),
    OS.COMPENSATION_FAILED: frozenset({OS.COMPENSATING}),  # compensated again
    OS.REJECTED: frozenset(),
    # the model's answer to it is journaled: a resumed step replays it, never calls again
    OS.REFUSED: frozenset(),
    OS.COMPENSATED: frozenset(),
}

OPERATION = StateMachine("tool operation", OS.values, OPERATION_TRANSITIONS)

# Groups of states the retry, the compensation and the pages read the ledger by.
UNKNOWN_OUTCOME = frozenset({OS.EXECUTING, OS.AMBIGUOUS})  # may or may not have happened: a person resolves it
HAPPENED = frozenset({OS.COMMITTED, OS.COMPENSATING, OS.COMPENSATED, OS.COMPENSATION_FAILED})
NOT_DONE_YET = frozenset({OS.PROPOSED, OS.AWAITING_APPROVAL, OS.APPROVED})
