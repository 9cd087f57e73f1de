"""The supervisor's executor: it carries out a run's approved proposals and compensation steps once
each, in a fixed order, under a lease on the run; a worker that dies half-way is replaced by the sweeper
(saga/sweeps.py), and the new one reconciles the operation it finds executing before it goes on.
Nothing is done twice. Then it settles the run (completed, or compensated)."""

import logging
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from agents.models import Workflow
from core import bus
from core.errors import LeaseLost, StepFailure, TransientFailure
from core.faults import faults
from runs.heartbeat import lease_keeper
from runs.models import Run, Task
from runs.selectors import set_aside_by_replan
from runs.services import sql
from runs.services.leases import worker_id
from runs.services.runs import run_transition
from tools.broker import approval_recheck, arguments_unseal, operation_execute, reconcile
from tools.catalog import tool_spec
from tools.models import ToolOperation
from tools.transitions import OPERATION

from .compensation import UNDO_REFUSED, compensation_plan

log = logging.getLogger("warden.saga")
OS, Kind = ToolOperation.Status, ToolOperation.Kind
SUPERVISED = Q(proposed=True) | Q(kind__in=[Kind.COMPENSATION, Kind.CORRECTION])
INLINE_RETRIES = 3


def carried_out_by_agent(run: Run) -> bool:
    """An external run's effects were made by its agent, with its own tools: its undo and corrections too
    are the agent's to carry out (it lists them, starts each and reports the outcome, runs/external.py)."""
    return run.workflow.planner == Workflow.Planner.EXTERNAL


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
        run_settle(run_id)  # nothing to call out: no lease needed (a duplicate message claims nothing)
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
        run_settle(run_id)
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


def run_settle(run_id: int) -> bool:
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


def compensation_step_reported(op: ToolOperation, *, failure: str) -> None:
    """An external agent carried out one step of a compensation and reported it (inside the reporting
    transaction; runs/external.py calls it through core.hooks): a failure hands the run to a person,
    a success marks what it undid; the run settles after commit, as the executor settles it."""
    if op.status != OS.COMMITTED:
        operation_supervised_failed(op.run, op, failure)  # the run needs a human; the original is marked
        return
    operation_compensated(op, f"{op.kind} {op.id} ({op.tool}) reported done by the agent")
    transaction.on_commit(lambda: run_operations(op.run_id))
