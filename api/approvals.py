"""Integration API for approval requests: list them, decide one."""

from datetime import datetime
from typing import Any, Literal

from ninja import Field, Query, Router, Schema, Status
from pydantic import ConfigDict

from agents.models import Agent
from api.schemas import BodyIn
from approvals.rules import allow_rule_create
from approvals.services import approval_decide
from core.errors import NotFound
from core.schemas import PathId, QueryWhole, Whole
from policy.models import AllowRule, ApprovalRequest
from policy.rules import allow_rule_revoke
from runs.models import Run
from tenancy.access import authorize, authorize_token, visible_rows
from tenancy.models import Project

router = Router(tags=["approvals"])


class DecisionOut(Schema):
    reviewer: str
    verdict: str
    comment: str
    arguments_hash: str
    edited: bool
    at: datetime


# What a reviewer saw and quotes back: the request's SHA-256 arguments hash.
ARGUMENTS_HASH = "615006a645a8dff63501a19101e44987ef23b4193c92a9c834974baac1e1bf20"


class ApprovalOut(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": 12,
                    "run": 57,
                    "task": "refund",
                    "kind": "operation",
                    "parent": None,
                    "items": [],
                    "quorum": 1,
                    "admins_only": False,
                    "arguments_hash": ARGUMENTS_HASH,
                    "status": "approved",
                    "summary": "refund payments.refund(charge='ch_T-4711', amount=1200)",
                    "requested_at": "2026-03-14T09:31:04.882Z",
                    "decided_at": "2026-03-14T09:36:47.015Z",
                    "decided_by": "grace",
                    "note": "duplicate charge confirmed on ticket T-4711",
                    "operations": [88],
                    "decisions": [
                        {
                            "reviewer": "grace",
                            "verdict": "approve",
                            "comment": "duplicate charge confirmed on ticket T-4711",
                            "arguments_hash": ARGUMENTS_HASH,
                            "edited": False,
                            "at": "2026-03-14T09:36:47.015Z",
                        }
                    ],
                }
            ]
        }
    )

    id: int
    run: int
    task: str | None
    kind: str
    parent: int | None
    items: list[int]
    quorum: int
    admins_only: bool = Field(description="Only the project's admins may decide it (the strictest matching policy)")
    arguments_hash: str = Field(description="Quote it in a decision: it binds the decision to what you saw")
    status: str
    summary: str
    requested_at: datetime
    decided_at: datetime | None
    decided_by: str | None
    note: str
    operations: list[int]
    decisions: list[DecisionOut]
    plan: dict[str, Any] | None = Field(
        None,
        description="A plan request's plan (kind plan); approve with edits by sending the edited plan as arguments",
    )


def approval_out(a: ApprovalRequest) -> dict:
    items = list(a.items.all())
    operations = [op.id for op in a.operations.all()] + [op.id for item in items for op in item.operations.all()]
    return {
        "id": a.id,
        "run": a.run_id,
        "task": a.task.key if a.task_id else None,
        "kind": a.kind,
        "parent": a.parent_id,
        "items": [item.id for item in items],
        "quorum": a.quorum,
        "admins_only": a.admins_only,
        "arguments_hash": a.arguments_hash,
        "decisions": [
            {
                "reviewer": d.reviewer.get_username(),
                "verdict": d.verdict,
                "comment": d.comment,
                "arguments_hash": d.arguments_hash,
                "edited": d.edited_arguments is not None,
                "at": d.at,
            }
            for d in a.decisions.all()
        ],
        "status": a.status,
        "summary": a.summary,
        "requested_at": a.requested_at,
        "decided_at": a.decided_at,
        "decided_by": a.decided_by.get_username() if a.decided_by_id else None,
        "note": a.note,
        "operations": sorted(operations),
        "plan": a.plan,
    }


class ApprovalsQuery(Schema):
    status: Literal["pending", "approved", "rejected", "withdrawn"] | None = "pending"
    run: QueryWhole(ge=1) | None = None


@router.get("/approvals", response=list[ApprovalOut], summary="Approval requests (pending by default)")
def list_approvals(request, filters: Query[ApprovalsQuery]):
    rows = ApprovalRequest.objects.select_related("task", "decided_by").prefetch_related(
        "operations", "items__operations", "decisions__reviewer"
    )
    authorize_token(request.auth, "read", what="approval requests", request=request)
    rows = visible_rows(rows, request.auth.user, field="run__project_id")  # only the caller's projects
    if filters.status:
        rows = rows.filter(status=filters.status)
    if filters.run:
        rows = rows.filter(run_id=filters.run)
    return [approval_out(a) for a in rows.order_by("id")[:500]]


class DecisionIn(BodyIn):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "decision": "approve",
                    "arguments_hash": ARGUMENTS_HASH,
                    "note": "duplicate charge confirmed on ticket T-4711",
                }
            ]
        }
    )

    decision: Literal["approve", "reject"]
    arguments_hash: str = Field(min_length=64, max_length=64, description="The request's hash, as you saw it")
    note: str = Field(default="", max_length=4000, description="Required to reject or to edit")
    arguments: dict[str, Any] | None = Field(default=None, description="Approve with these arguments instead")


@router.post("/approvals/{approval_id}/decision", response=ApprovalOut, summary="Approve or reject")
def decide(request, approval_id: PathId, payload: DecisionIn):
    project_id = ApprovalRequest.objects.filter(id=approval_id).values_list("run__project_id", flat=True).first()
    if project_id is None:
        raise NotFound(f"approval request {approval_id} does not exist")
    authorize(
        request.auth.user,
        project_id,
        "decide",
        what=f"approval request {approval_id}",
        token=request.auth,
        request=request,
    )
    approval_decide(
        request_id=approval_id,
        user=request.auth.user,
        approve=payload.decision == "approve",
        note=payload.note,
        seen_hash=payload.arguments_hash,
        edited_arguments=payload.arguments,
        request=request,
    )
    row = ApprovalRequest.objects.select_related("task", "decided_by").prefetch_related(
        "operations", "items__operations", "decisions__reviewer"
    )
    return approval_out(row.get(id=approval_id))


class AllowRuleIn(BodyIn):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "project": "default",
                    "tool": "tickets.create",
                    "arguments": {},
                    "agent": "incident-worker",
                    "note": "incident workers may open tickets without review",
                }
            ]
        }
    )

    project: str = Field(min_length=1, max_length=64)
    tool: str = Field(min_length=1, max_length=64)
    arguments: dict[str, Any] = Field(default_factory=dict, description="Exact values these arguments must have")
    agent: str | None = Field(default=None, max_length=64, description="Agent slug; default: any agent")
    run: Whole() | None = Field(default=None, description="Only this run; default: any run of the project")
    covers_irreversible: bool = Field(default=False, description="Admins only: allow an irreversible tool")
    note: str = Field(default="", max_length=2000)
    expires_at: datetime | None = Field(
        default=None,
        strict=False,
        description="When the rule ends; at most WARDEN_ALLOW_RULE_MAX_DAYS (30) days ahead, which is the default",
    )


class AllowRuleOut(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": 3,
                    "project": "default",
                    "tool": "tickets.create",
                    "arguments": {},
                    "agent": "incident-worker",
                    "run": None,
                    "covers_irreversible": False,
                    "note": "incident workers may open tickets without review",
                    "created_by": "ada",
                    "created_at": "2026-03-14T08:55:19.300Z",
                    "expires_at": "2026-04-13T08:55:19.300Z",
                    "revoked_at": None,
                }
            ]
        }
    )

    id: int
    project: str
    tool: str
    arguments: dict[str, Any]
    agent: str | None
    run: int | None
    covers_irreversible: bool
    note: str
    created_by: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


def allow_rule_out(rule) -> dict:
    return {
        "id": rule.id,
        "project": rule.project.slug,
        "tool": rule.tool,
        "arguments": rule.arguments,
        "agent": rule.agent.slug if rule.agent_id else None,
        "run": rule.run_id,
        "covers_irreversible": rule.covers_irreversible,
        "note": rule.note,
        "created_by": rule.created_by.get_username(),
        "created_at": rule.created_at,
        "expires_at": rule.expires_at,
        "revoked_at": rule.revoked_at,
    }


@router.get("/allow-rules", response=list[AllowRuleOut], summary="Standing allow rules of my projects")
def list_allow_rules(request):
    authorize_token(request.auth, "read", what="allow rules", request=request)
    rows = visible_rows(AllowRule.objects.select_related("project", "agent", "created_by"), request.auth.user)
    return [allow_rule_out(rule) for rule in rows[:500]]


@router.post("/allow-rules", response={201: AllowRuleOut}, summary="Always allow a tool call without review")
def create_allow_rule(request, payload: AllowRuleIn):
    project = Project.objects.filter(slug=payload.project).first()
    if project is None:
        raise NotFound(f"project {payload.project} does not exist")
    agent = Agent.objects.filter(slug=payload.agent).first() if payload.agent else None
    if payload.agent and agent is None:
        raise NotFound(f"agent {payload.agent} does not exist")
    run = Run.objects.filter(id=payload.run).first() if payload.run else None
    if payload.run and run is None:
        raise NotFound(f"run {payload.run} does not exist")
    rule = allow_rule_create(
        user=request.auth.user,
        project=project,
        tool=payload.tool,
        arguments=payload.arguments,
        agent=agent,
        run=run,
        covers_irreversible=payload.covers_irreversible,
        note=payload.note,
        expires_at=payload.expires_at,
        token=request.auth,
        request=request,
    )
    return Status(201, allow_rule_out(rule))


@router.post("/allow-rules/{rule_id}/revoke", response=AllowRuleOut, summary="Revoke an allow rule")
def revoke_allow_rule(request, rule_id: PathId):
    return allow_rule_out(
        allow_rule_revoke(user=request.auth.user, rule_id=rule_id, token=request.auth, request=request)
    )
