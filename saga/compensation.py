"""Compensation (the saga): undo what a stopped run committed, in reverse commit order, and correct what
cannot be undone (a reviewer approves each correction first); an operator's verdict on an operation whose
outcome is unknown. Each step is a ledger operation with its own idempotency key, carried out by the
supervisor's executor (saga/executor.py)."""

import logging

from django.conf import settings
from django.utils import timezone

from core import bus
from core.errors import Conflict, NotFound, WardenError
from policy.services import approval_request_for_operations
from runs.models import Run, Task
from runs.selectors import run_gate_facts
from runs.services.outbox import outbox_add
from runs.services.runs import run_approvals_withdraw, run_transition
from runs.transitions import TASK
from tenancy.audit import audited
from tools.broker import arguments_hash
from tools.catalog import tool_spec
from tools.gate import APPROVAL, REFUSE, Origin, gate
from tools.human import ASK
from tools.installation import run_key_prefix
from tools.ledger import operation_record
from tools.models import ToolOperation
from tools.registry import Reversibility
from tools.transitions import OPERATION, UNKNOWN_OUTCOME

log = logging.getLogger("warden.saga")
OS, Kind = ToolOperation.Status, ToolOperation.Kind
COMPENSABLE_FROM = (Run.Status.NEEDS_ATTENTION, Run.Status.FAILED, Run.Status.CANCELLED)
UNDO_REFUSED = "its undo was refused by the gate"
RUN_OPERATIONS = "run_operations"  # the executor's actor (saga/actors.py)


def _committed_writes(run_id: int):
    # A fork's inherited receipts are the effects of the run it came from: that run undoes them, not the fork.
    return (
        ToolOperation.objects.filter(run_id=run_id, kind=Kind.ACTION, inherited_from__isnull=True)
        .exclude(tool_class=ToolOperation.ToolClass.READ_ONLY)
        .filter(status__in=[OS.COMMITTED, OS.COMPENSATING, OS.COMPENSATION_FAILED])
        .select_related("task")
        .order_by("-committed_at", "-id")
    )


def compensation_plan(run_id: int) -> dict:
    """What a compensation of this run would do, for an operator to read before starting it: every
    committed reversible effect undone in reverse commit order, then a correction for each irreversible
    one (approved by a reviewer first). Secret arguments are redacted."""
    if not Run.objects.filter(id=run_id).exists():
        raise NotFound(f"run {run_id} does not exist")
    undo, correct, cannot = [], [], []
    for op in _committed_writes(run_id):
        plan = op.compensation or {}
        item = {
            "operation": op.id,
            "task": op.task.key if op.task_id else None,
            "tool": op.tool,
            "external_id": op.external_id,
            "committed_at": op.committed_at,
            "status": op.status,
            "action": plan.get("tool"),
            "arguments": plan.get("arguments"),
        }
        if op.status == OS.COMPENSATED:
            continue
        if op.reversibility == Reversibility.REVERSIBLE and plan.get("tool"):
            undo.append(item)
        elif plan.get("tool"):
            correct.append({**item, "needs_approval": True})
        else:
            cannot.append(item)
    return {"undo": undo, "correct": correct, "cannot_undo": cannot, "unresolved": compensation_unresolved(run_id)}


def compensation_unresolved(run_id: int) -> list[int]:
    """The run's actions whose outcome is unknown: a compensation waits until someone resolves them."""
    unknown = ToolOperation.objects.filter(run_id=run_id, status__in=UNKNOWN_OUTCOME, kind=Kind.ACTION)
    unknown = unknown.exclude(tool=ASK)  # a question waiting for its answer changed nothing (it is withdrawn)
    return list(unknown.values_list("id", flat=True))


def run_compensate_refusal(run: Run, *, running: list[str], unresolved: list[int]) -> WardenError | None:
    """A run may be compensated once it stopped (needs attention, failed, cancelled), no task of it still
    runs (``running``: their keys) and no operation's outcome is unknown (``unresolved``: their ids)."""
    if run.status not in COMPENSABLE_FROM:
        return Conflict(
            f"run {run.id} is {run.status}; only a run that needs attention, failed or was cancelled can be "
            "compensated (cancel a running run first)"
        )
    if running:
        return Conflict(f"tasks {', '.join(running)} are still running; compensate when they have stopped")
    if unresolved:
        return Conflict(f"operations {unresolved} may or may not have happened; resolve them before compensating")
    return None


def operation_resolve_refusal(op: ToolOperation) -> WardenError | None:
    if op.tool == ASK:
        return Conflict(f"operation {op.id} is a question to a person: it is answered, not resolved")
    if op.status in (OS.AMBIGUOUS, OS.EXECUTING):
        return None
    return Conflict(f"operation {op.id} is {op.status}; only an ambiguous one can be resolved")


def run_compensate(
    *,
    run_id: int,
    reason: str = "compensation requested by an operator",
    actor=None,
    via: str = "",
    request=None,
    detail=None,
) -> Run:
    """Start (or, after a failed compensation, continue) undoing what the run committed. Each undo and
    correction passes the gate like any other call: what it asks a reviewer for is bundled into one
    request, which ``actor`` (who asked for the compensation) cannot decide. Audited, with what it
    undoes and what it corrects."""
    now = timezone.now()
    who = {"actor": actor, "via": via, "request": request}
    with audited("run_compensate", **who, target=f"run {run_id}", detail={"reason": reason, **(detail or {})}) as act:
        run = Run.objects.select_for_update().select_related("workflow").filter(id=run_id).first()
        if run is None:
            raise NotFound(f"run {run_id} does not exist")
        act.update(run_id=run.id, project_id=run.project_id)
        running = list(run.tasks.filter(status=Task.Status.RUNNING).values_list("key", flat=True))
        plan = compensation_plan(run.id)
        refused = run_compensate_refusal(run, running=running, unresolved=plan["unresolved"])
        if refused is not None:
            raise refused
        TASK.move_where(run.tasks.all(), Task.Status.CANCELLED, status_reason="run compensated", finished_at=now)
        run_approvals_withdraw(run=run, reason="the run is being compensated")
        OPERATION.move_where(
            ToolOperation.objects.filter(run=run, kind=Kind.ACTION),
            OS.REJECTED,
            sources=[OS.PROPOSED, OS.APPROVED],
            status_reason="not done: the run was compensated",
            ended_at=now,
        )
        waiting = _undo_steps(run, plan["undo"] + plan["correct"])
        if waiting:
            approval_request_for_operations(
                run=run,
                operations=waiting,
                kind="correction",
                title=f"Run {run.id}: these {len(waiting)} compensation step(s) wait for a reviewer",
                requested_by_id=getattr(actor, "pk", None),
            )
        run_transition(run=run, to=Run.Status.COMPENSATING, reason=reason, now=now)
        run_operations_send(run)
        act["detail"].update(
            undo=[i["operation"] for i in plan["undo"]], correct=[i["operation"] for i in plan["correct"]]
        )
    log.info("run %s: compensation started (%d undo, %d wait for a reviewer)", run_id, len(plan["undo"]), len(waiting))
    return run


def _undo_steps(run: Run, items: list[dict]) -> list[ToolOperation]:
    """One undo or correction per committed effect (a failed one is tried again, same key and verdict);
    each original moves to compensating. Returns the steps that wait for a reviewer."""
    order = ToolOperation.objects.filter(run=run).exclude(kind=Kind.ACTION).count()
    waiting = []
    originals = ToolOperation.objects.in_bulk([item["operation"] for item in items])
    for item in items:
        original = originals[item["operation"]]
        retry = original.compensations.filter(status=OS.FAILED).first()
        if retry is not None:  # a compensation that failed before: try it again, same key and verdict
            OPERATION.move(retry, OS.APPROVED, status_reason="retried")
        elif not original.compensations.exists():
            op = _undo_record(run, original, item, order=order + 1)
            if op is None:
                continue  # the gate refuses the undo: the effect stands, and the run's reason says so
            order += 1
            if op.gate == APPROVAL:
                waiting.append(op)
        OPERATION.move(original, OS.COMPENSATING, status_reason="")
    return waiting


def _undo_record(run: Run, original: ToolOperation, item: dict, *, order: int) -> ToolOperation | None:
    """The undo (or correction) of one committed effect, judged by the gate and written to the ledger:
    approved to go, or waiting for a reviewer; None when the gate refuses it (the original is marked).
    Inside the compensation's transaction."""
    correction = "needs_approval" in item
    verdict = gate(
        run_id=run.id,
        facts=run_gate_facts(run.id, item["action"]),
        tool=item["action"],
        arguments=item["arguments"] or {},
        origin=Origin.CORRECTION if correction else Origin.COMPENSATION,
        corrects=original.tool,
    )
    if verdict.decision == REFUSE:
        why = f"{UNDO_REFUSED}: {'; '.join(verdict.reasons)}"[:4000]
        ToolOperation.objects.filter(id=original.id).update(status_reason=why)
        return None
    return operation_record(
        verdict=verdict,
        run_id=run.id,
        project_id=run.project_id,
        task_id=original.task_id,
        kind=Kind.CORRECTION if correction else Kind.COMPENSATION,
        tool=item["action"],
        idempotency_key=f"{run_key_prefix(run.id)}undo:{original.id}",
        arguments_hash=arguments_hash(item["action"], item["arguments"]),
        arguments=item["arguments"],
        status=OS.AWAITING_APPROVAL if verdict.waits else OS.APPROVED,
        compensates=original,
        order=order,
        declaration=getattr(tool_spec(item["action"], run.project_id), "declaration", ""),
    )


def operation_resolve(
    *, operation_id: int, committed: bool, note: str, actor=None, via: str = "", request=None
) -> ToolOperation:
    """An operator's verdict on an ambiguous operation the tool could not reconcile by itself. Audited."""
    who = {"actor": actor, "via": via, "request": request}
    detail = {"committed": committed, "note": note}
    with audited("operation_resolve", **who, target=f"operation {operation_id}", detail=detail) as act:
        op = ToolOperation.objects.select_for_update().select_related("run").filter(id=operation_id).first()
        if op is None:
            raise NotFound(f"operation {operation_id} does not exist")
        act.update(run_id=op.run_id, project_id=op.run.project_id)
        refused = operation_resolve_refusal(op)
        if refused is not None:
            raise refused
        verdict = "committed" if committed else "not committed"
        why = f"resolved by an operator: {verdict}" + (f" ({note})" if note else "")
        OPERATION.move(op, OS.COMMITTED if committed else OS.FAILED, status_reason=why, ended_at=timezone.now())
        bus.run_changed(op.run_id)
    return op


def run_operations_send(run: Run) -> None:
    """Wake the supervisor's executor for this run (inside the deciding transaction)."""
    Run.objects.filter(id=run.id).update(
        ops_lease_expires_at=timezone.now() + timezone.timedelta(seconds=settings.WARDEN["REDRIVE_AFTER_SECONDS"])
    )
    outbox_add(actor=RUN_OPERATIONS, kwargs={"run_id": run.id})
