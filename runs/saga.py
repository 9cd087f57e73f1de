"""What the supervisor does with the ledger in deterministic code: execute a run's proposals once,
behind one bundled approval, and compensate a run's committed effects (the saga).

Both are ledger operations with their own idempotency keys, executed in a fixed order by
``run_operations`` under a lease on the run; a worker that dies half-way is replaced by the sweeper, and
the new one reconciles the operation it finds executing before it goes on. Nothing is done twice.
"""

import logging
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from agents.models import Workflow
from core import bus, hooks
from core.errors import Conflict, LeaseLost, NotFound, StepFailure, TransientFailure, WardenError
from core.faults import faults
from tenancy.audit import audited
from tools.broker import approval_recheck, arguments_hash, arguments_unseal, operation_execute, reconcile
from tools.catalog import tool_spec
from tools.gate import APPROVAL, REFUSE, Origin, gate
from tools.human import ASK
from tools.installation import run_key_prefix
from tools.ledger import operation_record
from tools.models import ToolOperation
from tools.registry import Reversibility
from tools.transitions import OPERATION, UNKNOWN_OUTCOME

from .heartbeat import lease_keeper
from .models import Run, Task
from .selectors import set_aside_by_replan
from .services import sql
from .services.leases import worker_id
from .services.outbox import outbox_add
from .services.runs import run_transition
from .transitions import TASK

log = logging.getLogger("warden.saga")
OS, Kind = ToolOperation.Status, ToolOperation.Kind
COMPENSABLE_FROM = (Run.Status.NEEDS_ATTENTION, Run.Status.FAILED, Run.Status.CANCELLED)
SUPERVISED = Q(proposed=True) | Q(kind__in=[Kind.COMPENSATION, Kind.CORRECTION])
INLINE_RETRIES = 3
UNDO_REFUSED = "its undo was refused by the gate"
RUN_OPERATIONS = "run_operations"  # the executor's actor (runs/actors.py)


# --- propose mode ------------------------------------------------------------------------------------


def _has_proposals(run_id: int) -> bool:
    return sql.fetchone(
        "SELECT EXISTS (SELECT 1 FROM tools_tooloperation WHERE run_id = %s AND status = %s)", [run_id, OS.PROPOSED]
    )[0]


def proposals_bundle_if_any(run: Run, now) -> bool:
    """All tasks are done: if workers proposed operations, ask for one approval of all of them instead of
    completing the run. Reversible work is ordered first, irreversible last. Call with the run locked."""
    if not _has_proposals(run.id):  # most runs propose nothing: one cheap statement at the end of each
        return False
    proposals = list(
        ToolOperation.objects.filter(run=run, status=OS.PROPOSED).select_related("task").order_by("task__key", "step")
    )
    if not proposals:
        return False
    proposals.sort(key=lambda op: (op.reversibility == Reversibility.IRREVERSIBLE, op.task.key, op.step))
    for order, op in enumerate(proposals, 1):
        OPERATION.move(op, OS.AWAITING_APPROVAL, order=order)
    hooks.call(
        hooks.APPROVAL_REQUEST_FOR_OPERATIONS,
        run=run,
        operations=proposals,
        kind="bundle",
        title=f"Run {run.id}: the supervisor will execute these {len(proposals)} proposed operations once each",
        requested_by_id=Run.objects.filter(id=run.id).values_list("started_by_id", flat=True).get(),
    )
    run_transition(run=run, to=Run.Status.WAITING_FOR_APPROVAL, reason=f"{len(proposals)} proposals wait", now=now)
    return True


def proposals_drop(run: Run, *, reason: str) -> int:
    """The run ends without its supervisor's execution (it needed attention when its last task
    finished): its proposals are recorded as not done, never left pending. Call with the run locked."""
    if not _has_proposals(run.id):
        return 0
    why = f"not executed: {reason}"[:1000]
    return OPERATION.move_where(
        run.operations.all(), OS.REJECTED, sources=[OS.PROPOSED], status_reason=why, ended_at=timezone.now()
    )


# --- compensation --------------------------------------------------------------------------------------


def carried_out_by_agent(run: Run) -> bool:
    """An external run's effects were made by its agent, with its own tools: its undo and corrections too
    are the agent's to carry out (it lists them, starts each and reports the outcome, runs/external.py)."""
    return run.workflow.planner == Workflow.Planner.EXTERNAL


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
        hooks.call(hooks.APPROVALS_WITHDRAW, run=run, reason="the run is being compensated")
        OPERATION.move_where(
            ToolOperation.objects.filter(run=run, kind=Kind.ACTION),
            OS.REJECTED,
            sources=[OS.PROPOSED, OS.APPROVED],
            status_reason="not done: the run was compensated",
            ended_at=now,
        )
        waiting = _undo_steps(run, plan["undo"] + plan["correct"])
        if waiting:
            hooks.call(
                hooks.APPROVAL_REQUEST_FOR_OPERATIONS,
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


# --- the supervisor's executor ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecutorFence:
    """The supervisor's executor of one run: it holds the run's executor lease while the token it got
    when it claimed the lease is the run's current one (every claim increments it)."""

    run_id: int
    token: int

    def lost(self) -> bool:
        return not sql.fetchone(
            "SELECT EXISTS (SELECT 1 FROM runs_run WHERE id = %s AND ops_lease_token = %s)", [self.run_id, self.token]
        )[0]

    def __str__(self) -> str:
        return f"run {self.run_id}: the executor's token {self.token}"


def _claim(run_id: int, owner: str) -> ExecutorFence | None:
    now = timezone.now()
    lease = timezone.timedelta(seconds=settings.WARDEN["LEASE_SECONDS"])
    claimed = (
        Run.objects.filter(id=run_id)
        .filter(Q(ops_lease_owner="") | Q(ops_lease_expires_at__lt=now) | Q(ops_lease_expires_at__isnull=True))
        .update(ops_lease_owner=owner, ops_lease_expires_at=now + lease, ops_lease_token=F("ops_lease_token") + 1)
    )
    if not claimed:
        return None
    token = Run.objects.filter(id=run_id, ops_lease_owner=owner).values_list("ops_lease_token", flat=True).first()
    return ExecutorFence(run_id, token) if token is not None else None


def _supervised_work(run_id: int):
    return ToolOperation.objects.filter(run_id=run_id, status__in=[OS.APPROVED, OS.EXECUTING, OS.AMBIGUOUS]).filter(
        SUPERVISED
    )


def run_operations(run_id: int) -> None:
    """Execute the run's approved supervisor operations in order, then settle the run. The executor's
    lease is renewed by the process's heartbeat while it works and checked just before each call."""
    if not _supervised_work(run_id).exists():
        _settle(run_id)  # nothing to call out: no lease needed (a duplicate message claims nothing)
        return
    owner = worker_id()
    fence = _claim(run_id, owner)
    if fence is None:
        return  # another worker holds it
    lease_keeper.hold_executor(run_id, fence.token)
    try:
        while True:
            run = Run.objects.select_related("workflow").get(id=run_id)
            if run.status not in (Run.Status.RUNNING, Run.Status.COMPENSATING):
                return
            op = _supervised_work(run_id).select_related("task").order_by("order", "id").first()
            if op is None:
                break
            if carried_out_by_agent(run):
                return  # the agent reports it done; that report settles the run
            if not _execute_supervised(run, op, fence):
                return
        _settle(run_id)
    except LeaseLost as exc:
        log.warning("run %s: the executor stops: %s", run_id, exc)
    finally:
        lease_keeper.release_executor(run_id)
        Run.objects.filter(id=run_id, ops_lease_token=fence.token).update(ops_lease_owner="", ops_lease_expires_at=None)


def _execute_supervised(run: Run, op: ToolOperation, fence: ExecutorFence | None = None) -> bool:
    bus.run_changed(run.id)
    spec = tool_spec(op.tool, run.project_id)
    if spec is None:  # a project's HTTP or MCP tool removed (or disabled) since the call was planned
        return operation_supervised_failed(run, op, f"{op.tool} is no longer a tool of this project")
    if op.status == OS.APPROVED and approval_recheck(op, spec) is not None:
        return True  # rejected just now, or asked again: its verdict is not satisfied (any more); the others go on
    if op.kind == Kind.ACTION:
        where = {"task_key": op.task.key, "call": op.call_number}
        arguments = arguments_unseal(spec, op.task_id, op.step, op.arguments)
    else:
        where = {"task_key": "compensation", "call": op.order}
        arguments = op.arguments
    with faults.around_call(run.input, run_id=run.id, **where):
        return _execute_with_retries(run, op, spec, arguments, fence)


def _execute_with_retries(run: Run, op: ToolOperation, spec, arguments: dict, fence) -> bool:
    """The call of one supervised operation, retried a few times in place when it fails transiently."""
    for attempt in range(1, INLINE_RETRIES + 1):
        try:
            if op.status in (OS.EXECUTING, OS.AMBIGUOUS):
                outcome = reconcile(op, spec)
                if outcome is None:
                    op.refresh_from_db()
                    outcome = operation_execute(op, spec, arguments, fence=fence)
            else:
                outcome = operation_execute(op, spec, arguments, fence=fence)
            if outcome.error is not None:
                raise StepFailure(outcome.error["message"], "validation")
            break
        except TransientFailure as exc:
            op.refresh_from_db()
            if attempt == INLINE_RETRIES:
                return operation_supervised_failed(run, op, f"{exc} ({attempt} attempts)")
            time.sleep(settings.WARDEN["RETRY_BASE_SECONDS"] * attempt / 4)
        except StepFailure as exc:
            op.refresh_from_db()
            return operation_supervised_failed(run, op, str(exc))
    if op.compensates_id:
        operation_compensated(op, f"{op.kind} {op.id} ({op.tool}) committed")
    return True


def operation_compensated(step: ToolOperation, why: str) -> None:
    """The undo or correction ``step`` committed: the operation it compensates is compensated."""
    OPERATION.move_where(
        ToolOperation.objects.filter(id=step.compensates_id), OS.COMPENSATED, status_reason=why, ended_at=timezone.now()
    )


def operation_supervised_failed(run: Run, op: ToolOperation, message: str) -> bool:
    """An operation the supervisor executes failed for good: mark it (and what it compensates) failed and
    hand the run to a person (needs attention)."""
    now = timezone.now()
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(id=run.id)
        bus.run_changed(run.id)
        # An ambiguous one stays so (a person must say whether it happened); one refused before its call
        # stays rejected.
        OPERATION.move_where(
            ToolOperation.objects.filter(id=op.id).exclude(status=OS.AMBIGUOUS),
            OS.FAILED,
            status_reason=message[:4000],
            ended_at=now,
        )
        what = "proposal" if op.kind == Kind.ACTION else op.kind
        if op.compensates_id:
            OPERATION.move_where(
                ToolOperation.objects.filter(id=op.compensates_id),
                OS.COMPENSATION_FAILED,
                status_reason=f"{op.kind} {op.id} failed: {message}"[:4000],
            )
        if locked.status in (Run.Status.RUNNING, Run.Status.COMPENSATING):
            run_transition(
                run=locked,
                to=Run.Status.NEEDS_ATTENTION,
                reason=f"{what} {op.id} ({op.tool}) failed: {message}"[:4000],
                now=now,
            )
    log.warning("run %s: %s %s failed: %s", run.id, op.kind, op.id, message)
    return False


def _open_tasks(run: Run) -> bool:
    """Tasks that keep the run from completing: not those a re-plan superseded or replaced."""
    return run.tasks.exclude(status=Task.Status.COMPLETED).exclude(set_aside_by_replan(run.plan_version)).exists()


def _settle(run_id: int) -> bool:
    """Finish the run if its supervised work is done; True when it moved."""
    now = timezone.now()
    with transaction.atomic():
        run = Run.objects.select_for_update().get(id=run_id)
        bus.run_changed(run_id)
        ops = ToolOperation.objects.filter(run=run)
        if ops.filter(status__in=[OS.APPROVED, OS.EXECUTING, OS.AMBIGUOUS]).filter(SUPERVISED).exists():
            return False  # approved meanwhile: the message that approval sent will do it
        if run.status == Run.Status.COMPENSATING:
            if ops.filter(status=OS.AWAITING_APPROVAL).exists():
                return False  # corrections wait for a reviewer
            for correction in ops.filter(kind=Kind.CORRECTION, status=OS.REJECTED):
                OPERATION.move_where(
                    ToolOperation.objects.filter(id=correction.compensates_id),
                    OS.COMMITTED,
                    sources=[OS.COMPENSATING],
                    status_reason=f"correction not sent: {correction.status_reason}"[:4000],
                )
            undone = ops.filter(status=OS.COMPENSATED).count()
            reason = f"compensated: {undone} effects undone or corrected"
            # What still stands is said, not left for the ledger to reveal: no undo known, a correction refused.
            standing = [f"{item['operation']} ({item['tool']})" for item in compensation_plan(run.id)["cannot_undo"]]
            refused = ops.filter(kind=Kind.ACTION, status=OS.COMMITTED).filter(
                Q(status_reason__startswith="correction not sent") | Q(status_reason__startswith=UNDO_REFUSED)
            )
            standing += [f"{op_id} ({tool})" for op_id, tool in refused.values_list("id", "tool")]
            if standing:
                reason += f"; {len(standing)} still stand (not undone): operations {', '.join(standing)}"
            run_transition(run=run, to=Run.Status.COMPENSATED, reason=reason[:4000], now=now)
            return True
        elif run.status == Run.Status.RUNNING and not _open_tasks(run):
            if ops.filter(status=OS.AWAITING_APPROVAL).filter(SUPERVISED).exists():
                return False  # a proposal waits for a new approval (its tool's declaration changed)
            done = ops.filter(proposed=True, status=OS.COMMITTED).count()
            rejected = ops.filter(proposed=True, status=OS.REJECTED).count()
            run_transition(
                run=run,
                to=Run.Status.COMPLETED,
                reason=f"all tasks completed; proposals: {done} executed, {rejected} rejected",
                now=now,
            )
            return True
        return False


def ledger_sweep(now) -> dict:
    """The ledger's pass of the recovery sweeper (registered in runs/apps.py)."""
    return {
        "operations_redriven": redrive_operations(now),
        "runs_settled": settle_stranded(now),
        "compensations_started": compensate_by_policy(now),
    }


def settle_stranded(now) -> int:
    """Sweeper step: a run whose executor made its last call and died (or lost the database) before it
    settled the run: nothing is left to call, so no message would come; settle it here."""
    open_statuses = [OS.PROPOSED, OS.AWAITING_APPROVAL, OS.APPROVED, OS.EXECUTING, OS.AMBIGUOUS]
    work = ToolOperation.objects.filter(run=OuterRef("pk"), status__in=open_statuses)
    stranded = (
        Run.objects.filter(status__in=[Run.Status.RUNNING, Run.Status.COMPENSATING])
        .filter(Q(ops_lease_expires_at__lt=now) | Q(ops_lease_expires_at__isnull=True))
        .filter(Exists(ToolOperation.objects.filter(run=OuterRef("pk")).filter(SUPERVISED)))
        .exclude(Exists(work.filter(SUPERVISED)))
        .exclude(Exists(Task.objects.filter(run=OuterRef("pk")).exclude(status__in=Task.TERMINAL)))  # at work
        .exclude(workflow__planner=Workflow.Planner.EXTERNAL)  # the agent's report settles those
        .values_list("id", flat=True)
    )
    # Under each run's lock; nothing moves while tasks are open or corrections wait.
    return sum(_settle(run_id) for run_id in stranded)


def operation_awaits_decision(operation_id: int) -> bool:
    """Whether the call still waits for a reviewer's decision, or (human.ask) for a person's answer."""
    row = ToolOperation.objects.filter(id=operation_id).values_list("status", "tool").first()
    if row is None:
        return False
    status, tool = row
    return status == OS.AWAITING_APPROVAL or (tool == ASK and status == OS.EXECUTING)


def redrive_operations(now) -> int:
    """Sweeper step: runs with approved supervisor work whose executor lease lapsed (a lost message or a
    dead worker) get a fresh message."""
    stale = (
        ToolOperation.objects.filter(status__in=[OS.APPROVED, OS.EXECUTING, OS.AMBIGUOUS])
        .filter(SUPERVISED)
        .filter(run__status__in=[Run.Status.RUNNING, Run.Status.COMPENSATING])
        .exclude(run__workflow__planner=Workflow.Planner.EXTERNAL)  # nothing there for a worker to do
        .filter(Q(run__ops_lease_expires_at__lt=now) | Q(run__ops_lease_expires_at__isnull=True))
        .values_list("run_id", flat=True)
        .distinct()
    )
    sent = 0
    for run_id in stale:
        with transaction.atomic():
            run = Run.objects.select_for_update().get(id=run_id)
            expires = run.ops_lease_expires_at
            if expires is not None and expires >= now:
                continue
            Run.objects.filter(id=run_id).update(ops_lease_owner="")
            run_operations_send(run)
            sent += 1
    return sent


def compensate_by_policy(now) -> int:
    """Sweeper step: a run whose workflow compensates on failure (as the version the run started with
    says: run_workflow_settings), once no attempt is in flight."""
    pinned = Q(workflow_version__config__compensate_on_failure=True)
    unpinned = Q(workflow_version__isnull=True, workflow__compensate_on_failure=True)  # rows made around run_start
    candidates = Run.objects.filter(pinned | unpinned, status=Run.Status.NEEDS_ATTENTION).exclude(
        tasks__status=Task.Status.RUNNING
    )
    started = 0
    for run in candidates.filter(tasks__status=Task.Status.FAILED).distinct():
        if ToolOperation.objects.filter(run=run, status=OS.COMPENSATION_FAILED).exists():
            continue  # a compensation failed already: a human decides what next
        try:
            run_compensate(run_id=run.id, reason="compensating by the workflow's policy after a failure")
            started += 1
        except Conflict as exc:
            log.info("run %s: not compensated by policy yet: %s", run.id, exc)
    return started


def run_operations_send(run: Run) -> None:
    """Wake the supervisor's executor for this run (inside the deciding transaction)."""
    Run.objects.filter(id=run.id).update(
        ops_lease_expires_at=timezone.now() + timezone.timedelta(seconds=settings.WARDEN["REDRIVE_AFTER_SECONDS"])
    )
    outbox_add(actor=RUN_OPERATIONS, kwargs={"run_id": run.id})
