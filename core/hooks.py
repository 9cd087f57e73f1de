"""Calls a lower layer makes into an upper one inside its own transaction.

The broker writes an operation that must wait for a reviewer, and the engine cancels a run whose
approvals must be withdrawn, in the same transaction as the upper layer's rows; an after-commit event
would leave a window where the operation waits for a request that does not exist. So the upper layer
(approvals above the engine, the engine above the tools and core) provides these functions at start-up
(its AppConfig.ready) and the lower layers call them by name, without importing it. A call with no
provider raises: a missing approvals app can never let an operation go out unrecorded.
"""

from collections.abc import Callable

from django.core.exceptions import ImproperlyConfigured

# operation, requested_by_id → the ApprovalRequest created for one operation that waits for a reviewer
APPROVAL_REQUEST_FOR_OPERATION = "approval_request_for_operation"
# run, operations, kind, title, requested_by_id → one parent request for several operations (a bundle)
APPROVAL_REQUEST_FOR_OPERATIONS = "approval_request_for_operations"
# operation, arguments → the Question a human.ask call asks (its intent's transaction): its task parks on it
QUESTION_FOR_OPERATION = "question_for_operation"
# run (locked), reason → how many pending requests were withdrawn
APPROVALS_WITHDRAW = "approvals_withdraw"
# ids, reason, now → how many of these pending requests were withdrawn (their calls will not be made)
APPROVALS_WITHDRAW_IDS = "approvals_withdraw_ids"
# (runs) run (locked), now → True when the run's proposals now wait for one approval (a bundle)
PROPOSALS_BUNDLE_IF_ANY = "proposals_bundle_if_any"
# (runs) run (locked), reason → how many proposals were recorded as not done
PROPOSALS_DROP = "proposals_drop"
# run (locked), task (the planner's), plan, now → the plan now waits for a reviewer (an ApprovalRequest)
PLAN_HOLD = "plan_hold"
# (runs) operation id → whether it still waits for a reviewer's decision
OPERATION_AWAITS_DECISION = "operation_awaits_decision"

# (runs) event, project_id, data → a run webhook queued to the project's endpoints (outbox, same transaction)
WEBHOOK_EMIT = "webhook_emit"
# (approvals) project_id, workflow_id → the approval policies in force for a run starting now: [{id, name, digest}]
POLICIES_IN_FORCE = "policies_in_force"
# (runs) run_id, task_key, point, mode → True the first time a drill fault fires (recorded before it acts)
FAULT_FIRE_ONCE = "fault_fire_once"

_providers: dict[str, Callable] = {}
_sweeps: list[Callable] = []


def provide(name: str, function: Callable) -> None:
    """Register the one function that answers ``name`` (at start-up)."""
    _providers[name] = function


def add_sweep(function: Callable) -> None:
    """A pass of the recovery sweeper that an upper layer owns (redriving approved operations, expiring
    approvals, sending notifications): ``function(now)`` returns its counts by name. Registered at start-up."""
    if function not in _sweeps:
        _sweeps.append(function)


def sweeps() -> list[Callable]:
    return list(_sweeps)


def call(name: str, *args, **kwargs):
    try:
        function = _providers[name]
    except KeyError:
        raise ImproperlyConfigured(f"nothing provides {name!r}: are the tools and approvals apps installed?") from None
    return function(*args, **kwargs)
