"""Integration API, read side: tasks, the trace (a span tree, and OTLP/JSON with the GenAI
conventions), artifacts, audit events, workflows and agents, insight figures. Everything is limited
to the caller's projects and needs the token's ``read`` scope."""

from datetime import datetime
from typing import Any

from django.db.models import Q
from ninja import Field, Query, Router, Schema

from agents.models import Agent, Workflow
from approvals.access import authorize_token, project_ids
from approvals.models import AuditEvent, Project

from .api import keyset_page, run_for
from .insight import Figures, insight_choices, insight_compute
from .models import Artifact, Span, Task
from .otlp import run_otlp
from .trace import SPAN_FIELDS

router = Router(tags=["runs"])


class TaskDetailOut(Schema):
    id: int
    key: str
    agent: str
    objective: str
    depends_on: list[str]
    status: str
    status_reason: str
    failure_class: str
    attempts: int
    max_attempts: int
    recoveries: int
    steps: int
    tokens: int
    cost_usd: float
    started_at: datetime | None
    finished_at: datetime | None


@router.get("/runs/{run_id}/tasks", response=list[TaskDetailOut], summary="A run's tasks with usage and failures")
def list_tasks(request, run_id: int):
    run = run_for(request, run_id)
    return [
        {
            "id": t.id,
            "key": t.key,
            "agent": t.agent.slug,
            "objective": t.objective,
            "depends_on": t.depends_on,
            "status": t.status,
            "status_reason": t.status_reason,
            "failure_class": t.failure_class,
            "attempts": t.attempts,
            "max_attempts": t.max_attempts,
            "recoveries": t.recoveries,
            "steps": t.steps_used,
            "tokens": t.tokens_used,
            "cost_usd": t.cost_micros / 1_000_000,
            "started_at": t.started_at,
            "finished_at": t.finished_at,
        }
        for t in Task.objects.filter(run=run).select_related("agent").order_by("id")
    ]


class SpanNodeOut(Schema):
    id: int
    kind: str
    name: str
    status: str
    task_id: int | None
    attempt: int | None
    step: int | None
    started_at: datetime
    ended_at: datetime | None
    tokens_in: int
    tokens_out: int
    cost_usd: float
    children: list["SpanNodeOut"]


SpanNodeOut.model_rebuild()


@router.get(
    "/runs/{run_id}/trace",
    response=list[SpanNodeOut],
    summary="The trace as a span tree (bodies excluded: see the dashboard's payload download)",
)
def get_trace(request, run_id: int):
    run = run_for(request, run_id)
    nodes, roots = {}, []
    for row in Span.objects.filter(run=run).order_by("id").values(*SPAN_FIELDS):
        node = {
            "id": row["id"],
            "kind": row["kind"],
            "name": row["name"],
            "status": row["status"],
            "task_id": row["task_id"],
            "attempt": row["attempt"],
            "step": row["step"],
            "started_at": row["started_at"],
            "ended_at": row["ended_at"],
            "tokens_in": row["tokens_in"],
            "tokens_out": row["tokens_out"],
            "cost_usd": row["cost_micros"] / 1_000_000,
            "children": [],
        }
        nodes[row["id"]] = node
        parent = nodes.get(row["parent_id"]) if row["parent_id"] else None
        (parent["children"] if parent else roots).append(node)
    return roots


@router.get(
    "/runs/{run_id}/trace/otlp",
    response=dict[str, Any],
    summary="The trace as OTLP/JSON (an ExportTraceServiceRequest) with the GenAI semantic conventions",
)
def get_trace_otlp(request, run_id: int):
    return run_otlp(run_for(request, run_id))


class ArtifactOut(Schema):
    id: int
    key: str
    task: str
    version: int
    verification: str
    schema_: dict[str, Any] = Field(alias="schema")
    content: Any
    provenance: dict[str, Any]
    created_at: datetime


@router.get("/runs/{run_id}/artifacts", response=list[ArtifactOut], summary="A run's artifacts with provenance")
def list_artifacts(request, run_id: int):
    run = run_for(request, run_id)
    return [
        {
            "id": a.id,
            "key": a.key,
            "task": a.task.key,
            "version": a.version,
            "verification": a.verification,
            "schema": a.schema,
            "content": a.content,
            "provenance": a.provenance,
            "created_at": a.created_at,
        }
        for a in Artifact.objects.filter(run=run).select_related("task").order_by("id")
    ]


class AuditOut(Schema):
    id: int
    at: datetime
    actor: str
    via: str
    action: str
    outcome: str
    project: str | None
    run_id: int | None
    target: str
    detail: dict[str, Any]


class AuditPageOut(Schema):
    items: list[AuditOut]
    next_after: int | None


@router.get("/audit", response=AuditPageOut, summary="Audit events of my projects, newest first (cursor pages)")
def list_audit(
    request,
    run: int | None = Query(default=None, ge=1),  # noqa: B008
    action: str | None = Query(default=None, max_length=64),  # noqa: B008
    after: int | None = Query(default=None, ge=0),  # noqa: B008
    limit: int = Query(default=100, ge=1, le=500),  # noqa: B008
):
    authorize_token(request.auth, "read", what="the audit log", request=request)
    rows = AuditEvent.objects.order_by("-id")
    visible = project_ids(request.auth.user, "view")
    if visible is not None:
        rows = rows.filter(project_id__in=visible)
    if run:
        rows = rows.filter(run_id=run)
    if action:
        rows = rows.filter(action=action)
    page, next_after = keyset_page(rows, after=after, limit=limit)
    slugs = dict(Project.objects.filter(id__in={e.project_id for e in page}).values_list("id", "slug"))
    items = [
        {
            "id": e.id,
            "at": e.at,
            "actor": e.actor_label,
            "via": e.via,
            "action": e.action,
            "outcome": e.outcome,
            "project": slugs.get(e.project_id),
            "run_id": e.run_id,
            "target": e.target,
            "detail": e.detail,
        }
        for e in page
    ]
    return {"items": items, "next_after": next_after}


class AgentOut(Schema):
    slug: str
    name: str
    provider: str
    model: str
    allowed_tools: list[str]
    is_planner: bool


class WorkflowOut(Schema):
    slug: str
    name: str
    description: str
    project: str | None = Field(description="null: shared by every project")
    planner: str
    tasks: list[dict[str, Any]]


def _workflows(request):
    authorize_token(request.auth, "read", what="the workflows", request=request)
    visible = project_ids(request.auth.user, "view")
    rows = Workflow.objects.select_related("project").order_by("slug")
    if visible is not None:
        rows = rows.filter(Q(project__isnull=True) | Q(project_id__in=visible))
    return rows


@router.get("/workflows", response=list[WorkflowOut], summary="Workflows I may see (mine and shared ones)")
def list_workflows(request):
    return [
        {
            "slug": w.slug,
            "name": w.name,
            "description": w.description,
            "project": w.project.slug if w.project_id else None,
            "planner": w.planner,
            "tasks": w.tasks,
        }
        for w in _workflows(request)
    ]


@router.get("/agents", response=list[AgentOut], summary="The agent registry")
def list_agents(request):
    authorize_token(request.auth, "read", what="the agents", request=request)
    return [
        {
            "slug": a.slug,
            "name": a.name,
            "provider": a.provider,
            "model": a.model,
            "allowed_tools": a.allowed_tools,
            "is_planner": a.is_planner,
        }
        for a in Agent.objects.order_by("slug")
    ]


class FiguresOut(Schema):
    group: str
    runs: int
    finished: int
    completed: int
    success_rate: float | None
    cost_usd: float
    cost_per_successful_run_usd: float | None
    steps_p50: float | None
    steps_p95: float | None
    duration_p50_seconds: float | None
    duration_p95_seconds: float | None
    approval_wait_p50_seconds: float | None
    approval_wait_p95_seconds: float | None


class InsightOut(Schema):
    days: int
    since: datetime
    total: FiguresOut
    by_day: list[FiguresOut]
    by_workflow: list[FiguresOut]
    by_project: list[FiguresOut]
    top_failing_tools: list[tuple[str, int]]
    top_failing_agents: list[tuple[str, int]]


def _figures(f: Figures) -> dict:
    return {
        "group": f.label,
        "runs": f.runs,
        "finished": f.finished,
        "completed": f.completed,
        "success_rate": f.success_rate,
        "cost_usd": f.cost_micros / 1_000_000,
        "cost_per_successful_run_usd": None if f.cost_per_success is None else f.cost_per_success / 1_000_000,
        "steps_p50": f.steps_p50,
        "steps_p95": f.steps_p95,
        "duration_p50_seconds": f.duration_p50,
        "duration_p95_seconds": f.duration_p95,
        "approval_wait_p50_seconds": f.wait_p50,
        "approval_wait_p95_seconds": f.wait_p95,
    }


@router.get("/insight", response=InsightOut, summary="Run success, cost, steps, durations and waits of my projects")
def get_insight(
    request,
    days: int = Query(default=30, ge=1, le=366),  # noqa: B008
    workflow: str | None = Query(default=None, max_length=64),  # noqa: B008
    project: str | None = Query(default=None, max_length=64),  # noqa: B008
):
    authorize_token(request.auth, "read", what="the insight figures", request=request)
    visible = project_ids(request.auth.user, "view")
    projects, workflows = insight_choices(visible=visible)
    workflow_id = next((w.id for w in workflows if w.slug == workflow), -1) if workflow else None
    project_id = next((p.id for p in projects if p.slug == project), -1) if project else None
    data = insight_compute(
        visible=visible,
        projects=projects,
        workflows=workflows,
        days=days,
        workflow_id=workflow_id,
        project_id=project_id,
    )
    return {
        "days": data.days,
        "since": data.since,
        "total": _figures(data.total),
        "by_day": [_figures(f) for f in data.by_day],
        "by_workflow": [_figures(f) for f in data.by_workflow],
        "by_project": [_figures(f) for f in data.by_project],
        "top_failing_tools": data.top_tools,
        "top_failing_agents": data.top_agents,
    }
