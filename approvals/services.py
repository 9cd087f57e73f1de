"""Approval requests: created by the broker and the saga engine, decided by people (admin or API).

A decision is applied under the run's lock (lock order: run, then tasks and operations) so that it can
race neither the task that is about to park nor another reviewer.
"""

import logging

from django.db import transaction
from django.utils import timezone

from runs.errors import Conflict, NotFound
from runs.models import Run, Task
from runs.services.outbox import outbox_add
from runs.services.runs import run_transition, task_set_ready

from .models import ApprovalRequest

log = logging.getLogger("warden.approvals")
RUN_OPERATIONS = "run_operations"


def _describe(op) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in (op.arguments or {}).items())
    owner = f"{op.task.key} " if op.task_id else ""
    return f"{owner}{op.tool}({args})"[:1000]


def approval_request_for_operation(op) -> ApprovalRequest:
    """One call waits for a reviewer (the workflow's policy says so). Inside the intent's transaction."""
    request = ApprovalRequest.objects.create(
        run_id=op.run_id, task_id=op.task_id, kind=ApprovalRequest.Kind.OPERATION, summary=_describe(op)
    )
    op.approval = request
    op.save(update_fields=["approval"])
    return request


def approval_request_for_operations(*, run: Run, operations, kind: str, title: str) -> ApprovalRequest:
    """One request for several operations (a bundle of proposals, or the corrections of a compensation)."""
    lines = [title] + [f"{n}. {_describe(op)}" for n, op in enumerate(operations, 1)]
    request = ApprovalRequest.objects.create(run=run, kind=kind, summary="\n".join(lines))
    type(operations[0]).objects.filter(id__in=[op.id for op in operations]).update(approval=request)
    return request


def approvals_withdraw(*, run: Run, reason: str) -> int:
    """The run moved on (cancelled, compensated): nobody needs to decide any more, and nothing it still
    meant to do will be done. Run locked."""
    from tools.models import ToolOperation

    pending = ApprovalRequest.objects.filter(run=run, status=ApprovalRequest.Status.PENDING)
    ids = list(pending.values_list("id", flat=True))
    pending.update(status=ApprovalRequest.Status.WITHDRAWN, decided_at=timezone.now(), note=reason[:1000])
    OS = ToolOperation.Status
    not_done = {"status": OS.REJECTED, "status_reason": f"not done: {reason}"[:1000], "ended_at": timezone.now()}
    ToolOperation.objects.filter(approval_id__in=ids, status=OS.AWAITING_APPROVAL).update(**not_done)
    # Proposals not bundled yet, and approved agent calls nobody has started: they will not be done either.
    ToolOperation.objects.filter(run=run, kind="action", status__in=[OS.PROPOSED, OS.APPROVED]).update(**not_done)
    return len(ids)


def approval_decide(*, request_id: int, user, approve: bool, note: str = "") -> ApprovalRequest:
    """Approve or reject. Rejected operations are never called; approved ones go ahead (the parked task
    is sent again, the supervisor executes the bundle, the compensation sends its corrections)."""
    from tools.models import ToolOperation

    OS = ToolOperation.Status
    now = timezone.now()
    run_id = ApprovalRequest.objects.filter(id=request_id).values_list("run_id", flat=True).first()
    if run_id is None:
        raise NotFound(f"approval request {request_id} does not exist")
    with transaction.atomic():
        run = Run.objects.select_for_update().get(id=run_id)
        request = ApprovalRequest.objects.select_for_update().get(id=request_id)
        if request.status != ApprovalRequest.Status.PENDING:
            raise Conflict(f"approval request {request_id} is {request.status}; it cannot be decided again")
        request.status = ApprovalRequest.Status.APPROVED if approve else ApprovalRequest.Status.REJECTED
        request.decided_at, request.decided_by, request.note = now, user, note[:4000]
        request.save(update_fields=["status", "decided_at", "decided_by", "note"])
        verdict = "approved" if approve else "rejected"
        reason = f"{verdict} by {user}" + (f": {note}" if note else "")
        ToolOperation.objects.filter(approval=request, status=OS.AWAITING_APPROVAL).update(
            status=OS.APPROVED if approve else OS.REJECTED,
            status_reason=reason[:1000],
            ended_at=None if approve else now,
        )
        log.info("approval %s (%s) of run %s %s", request.id, request.kind, run.id, verdict)
        if request.kind == ApprovalRequest.Kind.OPERATION:
            _wake_parked_task(run, request, reason, now)
        elif request.kind == ApprovalRequest.Kind.BUNDLE:
            if run.status == Run.Status.WAITING_FOR_APPROVAL:
                run_transition(run=run, to=Run.Status.RUNNING, reason=f"proposals {reason}", now=now)
            run_operations_send(run)
        else:  # corrections: the compensation goes on either way
            run_operations_send(run)
    return request


def _wake_parked_task(run: Run, request: ApprovalRequest, reason: str, now) -> None:
    task = Task.objects.select_for_update().filter(id=request.task_id).first()
    if task is None or task.status != Task.Status.WAITING_FOR_APPROVAL:
        return  # still running: it sees the decision when it checks before parking
    if run.status == Run.Status.WAITING_FOR_APPROVAL:
        run_transition(run=run, to=Run.Status.RUNNING, reason=reason, now=now)
    task_set_ready(task=task, now=now)  # sends it; a run paused for a human holds it until resumed


def run_operations_send(run: Run) -> None:
    """Wake the supervisor's executor for this run (inside the deciding transaction)."""
    from django.conf import settings

    Run.objects.filter(id=run.id).update(
        ops_lease_expires_at=timezone.now() + timezone.timedelta(seconds=settings.WARDEN["REDRIVE_AFTER_SECONDS"])
    )
    outbox_add(actor=RUN_OPERATIONS, kwargs={"run_id": run.id})
