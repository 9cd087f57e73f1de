"""Propose mode, the engine's end of a run: when every task is done, the operations its workers proposed
wait for one bundled approval instead of the run completing (the saga's executor carries them out once
approved, saga/executor.py); a run that ends without that execution records them as not done."""

from django.utils import timezone

from policy.services import approval_request_for_operations
from tools.human import ASK
from tools.models import ToolOperation
from tools.registry import Reversibility
from tools.transitions import OPERATION

from ..models import Run
from . import sql
from .runs import run_transition

OS = ToolOperation.Status


PROPOSED = "(proposed)"  # the row proposals_probe adds; no task status reads so


def proposals_probe(run_id: int) -> tuple[str, list]:
    """A query of one row, PROPOSED, when the run's workers proposed operations, else of none: for a
    caller to add to a query of its own (UNION ALL) instead of asking proposals_exist apart."""
    return (
        "SELECT %s WHERE EXISTS (SELECT 1 FROM tools_tooloperation WHERE run_id = %s AND status = %s)",
        [PROPOSED, run_id, OS.PROPOSED],
    )


def proposals_exist(run_id: int) -> bool:
    return sql.fetchone(
        "SELECT EXISTS (SELECT 1 FROM tools_tooloperation WHERE run_id = %s AND status = %s)", [run_id, OS.PROPOSED]
    )[0]


def proposals_bundle_if_any(run: Run, now, *, proposed: bool | None = None) -> bool:
    """All tasks are done: if workers proposed operations, ask for one approval of all of them instead of
    completing the run. Reversible work is ordered first, irreversible last. Call with the run locked.
    ``proposed``: what the caller's proposals_probe (or proposals_exist) said (most runs propose
    nothing: asked once, in a statement the caller runs anyway)."""
    if not (proposals_exist(run.id) if proposed is None else proposed):
        return False
    proposals = list(
        ToolOperation.objects.filter(run=run, status=OS.PROPOSED).select_related("task").order_by("task__key", "step")
    )
    if not proposals:
        return False
    proposals.sort(key=lambda op: (op.reversibility == Reversibility.IRREVERSIBLE, op.task.key, op.step))
    for order, op in enumerate(proposals, 1):
        OPERATION.move(op, OS.AWAITING_APPROVAL, order=order)
    approval_request_for_operations(
        run=run,
        operations=proposals,
        kind="bundle",
        title=f"Run {run.id}: the supervisor will execute these {len(proposals)} proposed operations once each",
        requested_by_id=Run.objects.filter(id=run.id).values_list("started_by_id", flat=True).get(),
    )
    run_transition(run=run, to=Run.Status.WAITING_FOR_APPROVAL, reason=f"{len(proposals)} proposals wait", now=now)
    return True


def proposals_drop(run: Run, *, reason: str, proposed: bool | None = None) -> int:
    """The run ends without its supervisor's execution (it needed attention when its last task
    finished): its proposals are recorded as not done, never left pending. Call with the run locked."""
    if not (proposals_exist(run.id) if proposed is None else proposed):
        return 0
    why = f"not executed: {reason}"[:1000]
    return OPERATION.move_where(
        run.operations.all(), OS.REJECTED, sources=[OS.PROPOSED], status_reason=why, ended_at=timezone.now()
    )


def operation_awaits_decision(operation_id: int) -> bool:
    """Whether the call still waits for a reviewer's decision, or (human.ask) for a person's answer."""
    row = ToolOperation.objects.filter(id=operation_id).values_list("status", "tool").first()
    if row is None:
        return False
    status, tool = row
    return status == OS.AWAITING_APPROVAL or (tool == ASK and status == OS.EXECUTING)
