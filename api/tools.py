"""Integration API for the ledger: a run's operations, its compensation (preview and start), resolving
an ambiguous operation, and the sandbox systems' effects listing. Arguments are always redacted."""

import re
from datetime import datetime
from typing import Any, Literal

from django.conf import settings
from ninja import Field, Query, Router, Schema, Status
from pydantic import ConfigDict

from api.external import ExternalOperationOut, IntentIn
from api.external import operation_out as external_out
from api.governance import ChangeRequestOut, change_request_out
from api.runs import RunOut, run_for, run_out
from api.schemas import BodyIn
from core.errors import NotFound
from core.schemas import PathId, QueryWhole
from integrations.external import external_operation_intent
from runs.selectors import run_get
from saga.compensation import compensation_plan, operation_resolve, run_compensate
from tenancy.access import authorize, authorize_token, project_ids, visible_rows
from tenancy.models import ChangeRequest, Project
from tools.classifications import TOOL_NAME, TOOL_NAME_RULE, tool_classification_set
from tools.gate import Verdict
from tools.installation import run_key_prefix
from tools.models import SandboxCall, ToolClassification, ToolOperation

router = Router(tags=["ledger"])


LEGACY_RUN_PREFIX = re.compile(r"^warden:(\d+):")

EMAIL_ARGUMENTS = {
    "to": "worker-3@customers.example",
    "subject": "About today's incident",
    "body": "We are on it; your ticket is open and we will write again when it is resolved.",
}
CORRECTION = {
    "kind": "correction",
    "by": "correction_email",
    "tool": "email.send",
    "arguments": {
        "to": "worker-3@customers.example",
        "subject": "Correction: About today's incident",
        "body": "Please disregard our previous message: the action it described has been reversed.",
        "in_reply_to": "M-eb83687dee",
    },
}


class OperationOut(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": 517,
                    "task": "worker-3",
                    "step": 4,
                    "kind": "action",
                    "tool": "email.send",
                    "idempotency_key": "warden:i3fa9c0b12:42:worker-3:4",
                    "arguments": EMAIL_ARGUMENTS,
                    "tool_class": "non_idempotent_write",
                    "reversibility": "irreversible",
                    "proposed": False,
                    "status": "committed",
                    "status_reason": "resolved by an operator: committed (in the customer's inbox)",
                    "result": {"message_id": "M-eb83687dee", "status": "sent"},
                    "external_id": "M-eb83687dee",
                    "attempts": 1,
                    "compensation": CORRECTION,
                    "compensates": None,
                    "approval": None,
                    "verdict": {
                        "decision": "allow",
                        "summary": "allowed — no policy asks for a review",
                        "quorum": 0,
                        "admins_only": False,
                        "policies": [],
                        "allow_rule": None,
                        "classified_by": "registry",
                        "reasons": ["no policy asks for a review"],
                    },
                    "created_at": "2026-03-14T09:21:40.502Z",
                    "committed_at": "2026-03-14T09:21:40.731Z",
                    "ended_at": "2026-03-14T09:24:12.388Z",
                }
            ]
        }
    )

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
    verdict: "VerdictOut"
    created_at: datetime
    committed_at: datetime | None
    ended_at: datetime | None


class VerdictOut(Schema):
    decision: str = Field(description="allow, or approval: wait for the reviewers it names")
    summary: str
    quorum: int = Field(description="Approvals from distinct reviewers it needs")
    admins_only: bool
    policies: list[int] = Field(description="Approval policies that matched")
    allow_rule: int | None = Field(description="The allow rule that stood in for a reviewer")
    classified_by: str = Field(description="registry, project or unclassified (the most dangerous class)")
    reasons: list[str]


OperationOut.model_rebuild()


def verdict_out(data: dict) -> dict:
    verdict = Verdict.from_json(data)
    return {
        "decision": verdict.decision,
        "summary": verdict.summary(),
        "quorum": verdict.quorum,
        "admins_only": verdict.admins_only,
        "policies": list(verdict.policies),
        "allow_rule": verdict.allow_rule,
        "classified_by": verdict.classified_by,
        "reasons": list(verdict.reasons),
    }


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
        "verdict": verdict_out(op.verdict),
        "created_at": op.created_at,
        "committed_at": op.committed_at,
        "ended_at": op.ended_at,
    }


@router.get("/runs/{run_id}/operations", response=list[OperationOut], summary="A run's ledger of tool calls")
def list_operations(request, run_id: PathId):
    run_for(request, run_id)
    ops = ToolOperation.objects.filter(run_id=run_id).select_related("task").order_by("id")
    return [operation_out(op) for op in ops]


# The same path as the ledger's listing (one router per path): an external agent's intent, first.
@router.post(
    "/runs/{run_id}/operations", response={201: ExternalOperationOut}, summary="Record a side effect's intent first"
)
def operation_intent(request, run_id: PathId, payload: IntentIn):
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
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "undo": [
                        {
                            "operation": 516,
                            "task": "worker-3",
                            "tool": "crm.update",
                            "external_id": "cust-worker-3",
                            "committed_at": "2026-03-14T09:21:38.117Z",
                            "status": "committed",
                            "action": "crm.restore",
                            "arguments": {"customer_id": "cust-worker-3", "before": {"incident_ticket": None}},
                        },
                        {
                            "operation": 515,
                            "task": "worker-3",
                            "tool": "tickets.create",
                            "external_id": "T-859853a5bd",
                            "committed_at": "2026-03-14T09:21:35.940Z",
                            "status": "committed",
                            "action": "tickets.close",
                            "arguments": {
                                "ticket_id": "T-859853a5bd",
                                "reason": "compensated: the run was rolled back",
                            },
                        },
                    ],
                    "correct": [
                        {
                            "operation": 517,
                            "task": "worker-3",
                            "tool": "email.send",
                            "external_id": "M-eb83687dee",
                            "committed_at": "2026-03-14T09:21:40.731Z",
                            "status": "committed",
                            "action": "email.send",
                            "arguments": CORRECTION["arguments"],
                            "needs_approval": True,
                        }
                    ],
                    "cannot_undo": [],
                    "unresolved": [],
                }
            ]
        }
    )

    undo: list[PlannedUndoOut] = Field(description="Reversible effects, undone in this order (reverse commit order)")
    correct: list[PlannedUndoOut] = Field(description="Irreversible effects: a correction each, after approval")
    cannot_undo: list[PlannedUndoOut]
    unresolved: list[int] = Field(description="Ambiguous operations to resolve before compensating")


@router.get("/runs/{run_id}/compensation", response=CompensationPlanOut, summary="What compensating would do")
def get_compensation_plan(request, run_id: PathId):
    run_for(request, run_id)
    return compensation_plan(run_id)


class CompensateIn(BodyIn):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"reason": "false alarm: undo the tickets and correct the e-mails", "dry_run": True}]
        }
    )

    reason: str = Field(default="", max_length=1000)
    dry_run: bool = Field(default=False, description="Only list what would be undone or corrected; change nothing")


@router.post(
    "/runs/{run_id}/compensate",
    response={200: CompensationPlanOut, 202: RunOut},
    summary="Undo the run's committed effects (or, with dry_run, list them)",
)
def compensate(request, run_id: PathId, payload: CompensateIn):
    run_for(request, run_id, "operate")
    if payload.dry_run:
        return Status(200, compensation_plan(run_id))
    reason = payload.reason or f"compensation requested by {request.auth.user} through the API"
    run_compensate(run_id=run_id, reason=reason, actor=request.auth.user, via="api", request=request)
    return Status(202, run_out(run_get(run_id=run_id)))  # whoever may operate it may see the result


class ResolveIn(BodyIn):
    model_config = ConfigDict(json_schema_extra={"examples": [{"committed": True, "note": "in the customer's inbox"}]})

    committed: bool = Field(description="Whether the external system holds the effect")
    note: str = Field(default="", max_length=1000)


@router.post("/operations/{operation_id}/resolve", response=OperationOut, summary="Resolve an ambiguous operation")
def resolve(request, operation_id: PathId, payload: ResolveIn):
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
    who = {"actor": request.auth.user, "via": "api", "request": request}
    op = operation_resolve(operation_id=operation_id, committed=payload.committed, note=payload.note, **who)
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
    run: QueryWhole(ge=1) | None = Field(default=None, description="Only the effects of this run")
    key_prefix: str | None = Field(
        default=None,
        max_length=200,
        description="Keys starting so. Deprecated for one run's effects (use run): warden:42: still means run 42",
    )
    after: QueryWhole(ge=0) = Field(default=0, description="Only effects with a larger id (paging)")
    limit: QueryWhole(ge=1, le=5000) = 500


class EffectsOut(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "effects": [
                        {
                            "id": 2041,
                            "system": "tickets",
                            "kind": "tickets.create",
                            "tool": "tickets.create",
                            "idempotency_key": "warden:i3fa9c0b12:42:worker-3:2",
                            "object_id": "T-859853a5bd",
                            "at": "2026-03-14T09:21:35.938Z",
                        },
                        {
                            "id": 2043,
                            "system": "email",
                            "kind": "email.send",
                            "tool": "email.send",
                            "idempotency_key": "warden:i3fa9c0b12:42:worker-3:4",
                            "object_id": "M-eb83687dee",
                            "at": "2026-03-14T09:21:40.729Z",
                        },
                    ],
                    "next_after": None,
                }
            ]
        }
    )

    effects: list[EffectOut]
    next_after: int | None


@router.get(
    "/sandbox/effects", response=EffectsOut, summary="The effects the sandbox systems hold for my projects' runs"
)
def sandbox_effects(request, filters: Query[EffectsQuery]):
    if not settings.WARDEN["SANDBOX_TOOLS"]:
        raise NotFound("the sandbox systems are not enabled here")
    authorize_token(request.auth, "read", what="the sandbox effects", request=request)
    rows = SandboxCall.objects.filter(is_effect=True, id__gt=filters.after).order_by("id")
    visible = project_ids(request.auth.user, "view")
    if visible is not None:  # effects of the caller's projects' runs: their keys are in those runs' ledgers
        keys = ToolOperation.objects.filter(run__project_id__in=visible).values("idempotency_key")
        rows = rows.filter(idempotency_key__in=keys)
    if filters.system:
        rows = rows.filter(system=filters.system)
    if filters.run is not None:
        rows = rows.filter(idempotency_key__startswith=run_key_prefix(filters.run))
    if filters.key_prefix:
        legacy = LEGACY_RUN_PREFIX.match(filters.key_prefix)  # warden:<run>: from before keys named the installation
        prefix = run_key_prefix(int(legacy[1])) + filters.key_prefix[legacy.end() :] if legacy else filters.key_prefix
        rows = rows.filter(idempotency_key__startswith=prefix)
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


TOOL_CLASS = {
    "project": "default",
    "tool": "payments.refund",
    "tool_class": "non_idempotent_write",
    "reversibility": "irreversible",
    "approval": "always",
    "note": "refunds move money: every one waits for a reviewer",
}


class ToolClassIn(BodyIn):
    model_config = ConfigDict(json_schema_extra={"examples": [TOOL_CLASS]})

    project: str = Field(min_length=1, max_length=64)
    tool: str = Field(min_length=1, max_length=64, pattern=TOOL_NAME.pattern, description=TOOL_NAME_RULE)
    tool_class: Literal["read_only", "idempotent_write", "non_idempotent_write"]
    reversibility: Literal["", "reversible", "irreversible"] = ""
    approval: Literal["", "always", "refuse"] = Field(
        default="", description='"" (as the approval policies say), "always" (every call waits), "refuse" (never)'
    )
    note: str = Field(default="", max_length=2000)


class ToolClassOut(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{**TOOL_CLASS, "classified_by": "ada", "classified_at": "2026-03-14T08:40:02.117Z"}]
        }
    )

    project: str
    tool: str
    tool_class: str
    reversibility: str
    approval: str
    note: str
    classified_by: str | None
    classified_at: datetime


def tool_class_out(row: ToolClassification) -> dict:
    return {
        "project": row.project.slug,
        "tool": row.tool,
        "tool_class": row.tool_class,
        "reversibility": row.reversibility,
        "approval": row.approval,
        "note": row.note,
        "classified_by": row.classified_by.get_username() if row.classified_by_id else None,
        "classified_at": row.classified_at,
    }


@router.get("/tool-classes", response=list[ToolClassOut], summary="What my projects say their agents' tools do")
def list_tool_classes(request):
    authorize_token(request.auth, "read", what="tool classes", request=request)
    rows = visible_rows(ToolClassification.objects.select_related("project", "classified_by"), request.auth.user)
    return [tool_class_out(row) for row in rows[:1000]]


@router.post(
    "/tool-classes",
    response={200: ToolClassOut, 202: ChangeRequestOut},
    summary="Classify a tool (project admins): 200 when it applies; 202 with the change request when it asks "
    "less than before and waits for a second admin",
)
def classify_tool(request, payload: ToolClassIn):
    """An external agent's tool, or an MCP tool's class confirmed (its server only suggests one). A
    classification never lowers a declared HTTP tool (422)."""
    project = Project.objects.filter(slug=payload.project).first()
    if project is None:
        raise NotFound(f"project {payload.project} does not exist")
    row = tool_classification_set(
        user=request.auth.user,
        project=project,
        tool=payload.tool,
        tool_class=payload.tool_class,
        reversibility=payload.reversibility,
        approval=payload.approval,
        note=payload.note,
        token=request.auth,
        request=request,
    )
    if isinstance(row, ChangeRequest):
        held = ChangeRequest.objects.select_related("project", "requested_by", "decided_by").get(id=row.id)
        return Status(202, change_request_out(held))
    return tool_class_out(ToolClassification.objects.select_related("project", "classified_by").get(id=row.id))
