"""Integration API for approval requests: list them, decide one."""

from datetime import datetime
from typing import Literal

from ninja import Field, Query, Router, Schema

from runs.permissions import require

from .models import ApprovalRequest
from .services import approval_decide

router = Router(tags=["approvals"])


class ApprovalOut(Schema):
    id: int
    run: int
    task: str | None
    kind: str
    status: str
    summary: str
    requested_at: datetime
    decided_at: datetime | None
    decided_by: str | None
    note: str
    operations: list[int]


def approval_out(a: ApprovalRequest) -> dict:
    return {
        "id": a.id,
        "run": a.run_id,
        "task": a.task.key if a.task_id else None,
        "kind": a.kind,
        "status": a.status,
        "summary": a.summary,
        "requested_at": a.requested_at,
        "decided_at": a.decided_at,
        "decided_by": a.decided_by.get_username() if a.decided_by_id else None,
        "note": a.note,
        "operations": sorted(op.id for op in a.operations.all()),
    }


class ApprovalsQuery(Schema):
    status: Literal["pending", "approved", "rejected", "withdrawn"] | None = "pending"
    run: int | None = None


@router.get("/approvals", response=list[ApprovalOut], summary="Approval requests (pending by default)")
def list_approvals(request, filters: Query[ApprovalsQuery]):
    rows = ApprovalRequest.objects.select_related("task", "decided_by").prefetch_related("operations")
    if filters.status:
        rows = rows.filter(status=filters.status)
    if filters.run:
        rows = rows.filter(run_id=filters.run)
    return [approval_out(a) for a in rows.order_by("id")[:500]]


class DecisionIn(Schema):
    decision: Literal["approve", "reject"]
    note: str = Field(default="", max_length=4000)


@router.post("/approvals/{approval_id}/decision", response=ApprovalOut, summary="Approve or reject")
def decide(request, approval_id: int, payload: DecisionIn):
    require(request.auth.user, "approvals.change_approvalrequest", "decide approval requests")
    approval_decide(
        request_id=approval_id, user=request.auth.user, approve=payload.decision == "approve", note=payload.note
    )
    row = ApprovalRequest.objects.select_related("task", "decided_by").prefetch_related("operations")
    return approval_out(row.get(id=approval_id))
