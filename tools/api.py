"""Integration API for the ledger: a run's operations, its compensation (preview and start), resolving
an ambiguous operation, and the sandbox systems' effects listing. Arguments are always redacted."""

from datetime import datetime
from typing import Any

from django.conf import settings
from ninja import Field, Query, Router, Schema, Status

from approvals.access import authorize, authorize_token
from approvals.audit import audit
from runs.api import RunOut, run_for, run_out
from runs.api_external import ExternalOperationOut, IntentIn
from runs.api_external import operation_out as external_out
from runs.errors import NotFound
from runs.external import external_operation_intent
from runs.selectors import run_get

from .models import SandboxCall, ToolOperation
from .saga import compensation_plan, operation_resolve, run_compensate

router = Router(tags=["ledger"])


class OperationOut(Schema):
    id: int
    task: str | None
    step: int | None
    kind: str
    tool: str
    idempotency_key: str
    arguments: dict[str, Any]
    tool_class: str
    reversibility: str
    proposed: bool
    status: str
    status_reason: str
    result: Any = None
    external_id: str
    attempts: int
    compensation: dict[str, Any] | None
    compensates: int | None
    approval: int | None
    created_at: datetime
    committed_at: datetime | None
    ended_at: datetime | None


def operation_out(op: ToolOperation) -> dict:
    return {
        "id": op.id,
        "task": op.task.key if op.task_id else None,
        "step": op.step,
        "kind": op.kind,
        "tool": op.tool,
        "idempotency_key": op.idempotency_key,
        "arguments": op.arguments,
        "tool_class": op.tool_class,
        "reversibility": op.reversibility,
        "proposed": op.proposed,
        "status": op.status,
        "status_reason": op.status_reason,
        "result": op.result,
        "external_id": op.external_id,
        "attempts": op.attempts,
        "compensation": op.compensation,
        "compensates": op.compensates_id,
        "approval": op.approval_id,
        "created_at": op.created_at,
        "committed_at": op.committed_at,
        "ended_at": op.ended_at,
    }


@router.get("/runs/{run_id}/operations", response=list[OperationOut], summary="A run's ledger of tool calls")
def list_operations(request, run_id: int):
    run_for(request, run_id)
    ops = ToolOperation.objects.filter(run_id=run_id).select_related("task").order_by("id")
    return [operation_out(op) for op in ops]


# The same path as the ledger's listing (one router per path): an external agent's intent, first.
@router.post(
    "/runs/{run_id}/operations", response={201: ExternalOperationOut}, summary="Record a side effect's intent first"
)
def operation_intent(request, run_id: int, payload: IntentIn):
    run_for(request, run_id, "start")
    op = external_operation_intent(run_id=run_id, **payload.dict())
    return Status(201, external_out(op))


class PlannedUndoOut(Schema):
    operation: int
    task: str | None
    tool: str
    external_id: str
    committed_at: datetime | None
    status: str
    action: str | None
    arguments: dict[str, Any] | None
    needs_approval: bool = False


class CompensationPlanOut(Schema):
    undo: list[PlannedUndoOut] = Field(description="Reversible effects, undone in this order (reverse commit order)")
    correct: list[PlannedUndoOut] = Field(description="Irreversible effects: a correction each, after approval")
    cannot_undo: list[PlannedUndoOut]
    unresolved: list[int] = Field(description="Ambiguous operations to resolve before compensating")


@router.get("/runs/{run_id}/compensation", response=CompensationPlanOut, summary="What compensating would do")
def get_compensation_plan(request, run_id: int):
    run_for(request, run_id)
    return compensation_plan(run_id)


class CompensateIn(Schema):
    reason: str = Field(default="", max_length=1000)
    dry_run: bool = Field(default=False, description="Only list what would be undone or corrected; change nothing")


@router.post(
    "/runs/{run_id}/compensate",
    response={200: CompensationPlanOut, 202: RunOut},
    summary="Undo the run's committed effects (or, with dry_run, list them)",
)
def compensate(request, run_id: int, payload: CompensateIn):
    run = run_for(request, run_id, "operate")
    if payload.dry_run:
        return Status(200, compensation_plan(run_id))
    reason = payload.reason or f"compensation requested by {request.auth.user} through the API"
    run_compensate(run_id=run_id, reason=reason)
    audit(
        actor=request.auth.user,
        action="compensate",
        run=run,
        target=f"run {run_id}",
        request=request,
        detail={"reason": reason},
    )
    return Status(202, run_out(run_get(run_id=run_id)))  # whoever may operate it may see the result


class ResolveIn(Schema):
    committed: bool = Field(description="Whether the external system holds the effect")
    note: str = Field(default="", max_length=1000)


@router.post("/operations/{operation_id}/resolve", response=OperationOut, summary="Resolve an ambiguous operation")
def resolve(request, operation_id: int, payload: ResolveIn):
    found = ToolOperation.objects.filter(id=operation_id).select_related("run").first()
    if found is None:
        raise NotFound(f"operation {operation_id} does not exist")
    authorize(
        request.auth.user,
        found.run.project_id,
        "operate",
        what=f"operation {operation_id}",
        token=request.auth,
        request=request,
    )
    op = operation_resolve(operation_id=operation_id, committed=payload.committed, note=payload.note)
    audit(
        actor=request.auth.user,
        action="resolve",
        run=found.run,
        target=f"operation {operation_id}",
        request=request,
        detail={"committed": payload.committed, "note": payload.note},
    )
    return operation_out(ToolOperation.objects.select_related("task").get(id=op.id))


class EffectOut(Schema):
    id: int
    system: str
    kind: str
    tool: str
    idempotency_key: str
    object_id: str
    at: datetime


class EffectsQuery(Schema):
    system: str | None = Field(default=None, max_length=32)
    key_prefix: str | None = Field(default=None, max_length=200, description="e.g. warden:42: for one run")
    after: int = Field(default=0, ge=0, description="Only effects with a larger id (paging)")
    limit: int = Field(default=500, ge=1, le=5000)


class EffectsOut(Schema):
    effects: list[EffectOut]
    next_after: int | None


@router.get("/sandbox/effects", response=EffectsOut, summary="Every effect the sandbox systems hold")
def sandbox_effects(request, filters: Query[EffectsQuery]):
    if not settings.WARDEN["SANDBOX_TOOLS"]:
        raise NotFound("the sandbox systems are not enabled here")
    authorize_token(request.auth, "read", what="the sandbox effects", request=request)
    rows = SandboxCall.objects.filter(is_effect=True, id__gt=filters.after).order_by("id")
    if filters.system:
        rows = rows.filter(system=filters.system)
    if filters.key_prefix:
        rows = rows.filter(idempotency_key__startswith=filters.key_prefix)
    page = list(rows[: filters.limit + 1])
    more = len(page) > filters.limit
    page = page[: filters.limit]
    return {
        "effects": [
            {
                "id": row.id,
                "system": row.system,
                "kind": f"{row.system}.{row.operation}",
                "tool": row.tool,
                "idempotency_key": row.idempotency_key,
                "object_id": row.object_id,
                "at": row.created_at,
            }
            for row in page
        ],
        "next_after": page[-1].id if more else None,
    }
