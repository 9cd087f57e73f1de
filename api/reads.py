"""Integration API, read side: tasks, the trace (a span tree, and OTLP/JSON with the GenAI
conventions), artifacts, audit events, workflows and agents, insight figures. Everything is limited
to the caller's projects and needs the token's ``read`` scope."""

from datetime import date, datetime
from typing import Any, Literal

from ninja import Field, Query, Router, Schema
from pydantic import ConfigDict

from agents.selectors import agents_listed, workflows_visible
from api.runs import keyset_page, run_for
from integrations.otlp import otlp_example, run_otlp
from runs.schemas import PathId, QueryWhole
from runs.selectors.insight import Figures, insight_choices, insight_compute
from runs.selectors.run_page import run_artifact_rows, run_task_rows
from runs.selectors.trace import span_rows
from tenancy.access import authorize_token, project_ids
from tenancy.selectors import audit_events, project_slugs

router = Router(tags=["runs"])


class TaskDetailOut(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": 311,
                    "key": "worker-3",
                    "agent": "incident-worker",
                    "objective": "Handle the incident for customer 3: read, ticket, update, e-mail",
                    "depends_on": [],
                    "status": "completed",
                    "status_reason": "",
                    "failure_class": "",
                    "attempts": 2,
                    "max_attempts": 3,
                    "recoveries": 1,
                    "steps": 9,
                    "tokens": 3120,
                    "cost_usd": 0.0042,
                    "started_at": "2026-03-14T09:20:44.251Z",
                    "finished_at": "2026-03-14T09:21:58.930Z",
                }
            ]
        }
    )

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
def list_tasks(request, run_id: PathId):
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
        for t in run_task_rows(run.id)
    ]


def _span_example(pk: int, kind: str, name: str, started: str, ended: str | None, children=(), **fields) -> dict:
    return {"id": pk, "kind": kind, "name": name, "status": "ok", "task_id": None, "attempt": None, "step": None,
            "started_at": started, "ended_at": ended, "tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0,
            **fields, "children": list(children)}  # fmt: skip


TRACE_EXAMPLE = _span_example(
    901, "run", "run deploy-review", "2026-03-14T09:12:03.412Z", None, status="running",
    children=[_span_example(
        902, "task", "task inventory", "2026-03-14T09:12:03.520Z", "2026-03-14T09:12:09.904Z", task_id=305,
        children=[_span_example(
            903, "attempt", "attempt 1", "2026-03-14T09:12:03.533Z", "2026-03-14T09:12:09.904Z", task_id=305,
            attempt=1,
            children=[
                _span_example(904, "tool_call", "deployments.read", "2026-03-14T09:12:07.118Z",
                              "2026-03-14T09:12:07.164Z", task_id=305, attempt=1, step=2),
                _span_example(905, "model_call", "scripted-1", "2026-03-14T09:12:07.170Z", "2026-03-14T09:12:09.904Z",
                              task_id=305, attempt=1, step=3, tokens_in=512, tokens_out=48, cost_usd=0.0004),
            ],
        )],
    )],
)  # fmt: skip


class SpanNodeOut(Schema):
    model_config = ConfigDict(json_schema_extra={"examples": [TRACE_EXAMPLE]})

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
def get_trace(request, run_id: PathId):
    run = run_for(request, run_id)
    nodes, roots = {}, []
    for row in span_rows(run.id):
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
        nodes[row["id"]] = (node, row["parent_id"])
    for node, parent_id in nodes.values():  # a second pass: an ingested span may be older than its parent
        parent = nodes.get(parent_id) if parent_id else None
        (parent[0]["children"] if parent else roots).append(node)
    return roots


# The response is free-form, so its example sits on the operation; built by the same encoder.
OTLP_EXAMPLE = otlp_example()


@router.get(
    "/runs/{run_id}/trace/otlp",
    response=dict[str, Any],
    summary="The trace as OTLP/JSON (an ExportTraceServiceRequest) with the GenAI semantic conventions",
    openapi_extra={"responses": {200: {"content": {"application/json": {"example": OTLP_EXAMPLE}}}}},
)
def get_trace_otlp(request, run_id: PathId):
    return run_otlp(run_for(request, run_id))


class ArtifactOut(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": 77,
                    "key": "worker-3",
                    "task": "worker-3",
                    "version": 1,
                    "verification": "unverified",
                    # As the API answers it: responses use field names, not aliases (ninja's by_alias=False).
                    "output_schema": {
                        "type": "object",
                        "required": ["summary"],
                        "properties": {"summary": {"type": "string", "minLength": 1}},
                    },
                    "content": {"summary": "worker-3: ticket opened, record updated, customer e-mail sent"},
                    "provenance": {
                        "task": "worker-3",
                        "agent": 5,
                        "attempt": 2,
                        "fencing_token": 7,
                        "model": "scripted-1",
                        "step": 9,
                        "inputs": [],
                    },
                    "created_at": "2026-03-14T09:21:58.930Z",
                }
            ]
        }
    )

    id: int
    key: str
    task: str
    version: int
    verification: str
    output_schema: dict[str, Any] = Field(description="The JSON Schema the content was checked against")
    content: Any
    provenance: dict[str, Any]
    created_at: datetime


@router.get("/runs/{run_id}/artifacts", response=list[ArtifactOut], summary="A run's artifacts with provenance")
def list_artifacts(request, run_id: PathId):
    run = run_for(request, run_id)
    return [
        {
            "id": a.id,
            "key": a.key,
            "task": a.task.key,
            "version": a.version,
            "verification": a.verification,
            "output_schema": a.schema,
            "content": a.content,
            "provenance": a.provenance,
            "created_at": a.created_at,
        }
        for a in run_artifact_rows(run.id)
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
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "items": [
                        {
                            "id": 1804,
                            "at": "2026-03-14T09:25:31.640Z",
                            "actor": "ada",
                            "via": "api",
                            "action": "run_cancel",
                            "outcome": "done",
                            "project": "default",
                            "run_id": 42,
                            "target": "run 42",
                            "detail": {"reason": "the customer called it off"},
                        }
                    ],
                    "next_after": None,
                }
            ]
        }
    )

    items: list[AuditOut]
    next_after: int | None


@router.get("/audit", response=AuditPageOut, summary="Audit events of my projects, newest first (cursor pages)")
def list_audit(
    request,
    run: QueryWhole(ge=1) | None = Query(default=None),  # noqa: B008
    action: str | None = Query(default=None, max_length=64),  # noqa: B008
    after: QueryWhole(ge=0) | None = Query(default=None),  # noqa: B008
    limit: QueryWhole(ge=1, le=500) = Query(default=100),  # noqa: B008
):
    authorize_token(request.auth, "read", what="the audit log", request=request)
    rows = audit_events(visible=project_ids(request.auth.user, "view"), run_id=run, action=action)
    page, next_after = keyset_page(rows, after=after, limit=limit)
    slugs = project_slugs({e.project_id for e in page})
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
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "slug": "incident-worker",
                    "name": "Incident worker",
                    "provider": "scripted",
                    "model": "scripted-1",
                    "allowed_tools": ["crm.read", "tickets.create", "crm.update", "email.send"],
                    "is_planner": False,
                }
            ]
        }
    )

    slug: str
    name: str
    provider: str
    model: str
    allowed_tools: list[str]
    is_planner: bool


class WorkflowOut(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "slug": "deploy-review",
                    "name": "Deploy review",
                    "description": "Inventory and risk in parallel, then a verifier's verdict.",
                    "project": None,
                    "planner": "static",
                    "tasks": [
                        {"key": "inventory", "agent": "inventory-agent", "objective": "Read the checkout deployment"},
                        {"key": "risk", "agent": "risk-agent", "objective": "Review the deployment's risk"},
                        {
                            "key": "verify",
                            "agent": "verifier-agent",
                            "objective": "Give the verdict",
                            "depends_on": ["inventory", "risk"],
                        },
                    ],
                }
            ]
        }
    )

    slug: str
    name: str
    description: str
    project: str | None = Field(description="null: shared by every project")
    planner: str
    tasks: list[dict[str, Any]]


def _workflows(request):
    authorize_token(request.auth, "read", what="the workflows", request=request)
    return workflows_visible(user=request.auth.user).order_by("slug")


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
        for a in agents_listed()
    ]


class FiguresOut(Schema):
    group: str
    runs: int
    finished: int
    completed: int
    success_rate: float | None
    cost_usd: float
    cost_per_successful_run_usd: float | None
    failed_runs_cost_usd: float = Field(0, description="What the finished runs that did not complete cost")
    steps_p50: float | None
    steps_p95: float | None
    duration_p50_seconds: float | None
    duration_p95_seconds: float | None
    approval_wait_p50_seconds: float | None
    approval_wait_p95_seconds: float | None


FIGURES_EXAMPLE = {
    "group": "All runs",
    "runs": 12,
    "finished": 10,
    "completed": 8,
    "success_rate": 0.8,
    "cost_usd": 0.412,
    "cost_per_successful_run_usd": 0.0515,
    "failed_runs_cost_usd": 0.0312,
    "steps_p50": 9.0,
    "steps_p95": 38.0,
    "duration_p50_seconds": 41.2,
    "duration_p95_seconds": 156.5,
    "approval_wait_p50_seconds": 95.0,
    "approval_wait_p95_seconds": 1320.0,
}


class CostPeriodOut(Schema):
    tokens: int
    cost_usd: float


class CostGroupOut(Schema):
    name: str = Field(description="The agent's slug, or the model that answered")
    calls: int
    tokens: int
    cost_usd: float
    per_period: list[CostPeriodOut] = Field(description="One per period of ``periods``, in order")


class CostOverTimeOut(Schema):
    grain: str
    periods: list[date] = Field(description="The first day of each period (a week starts on Monday)")
    by_agent: list[CostGroupOut]
    by_model: list[CostGroupOut]


class InsightOut(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "days": 1,
                    "since": "2026-03-14T00:00:00Z",
                    "total": FIGURES_EXAMPLE,
                    "by_day": [{**FIGURES_EXAMPLE, "group": "2026-03-14"}],
                    "by_workflow": [
                        {
                            **FIGURES_EXAMPLE,
                            "group": "Incident fan-out",
                            "runs": 7,
                            "finished": 6,
                            "completed": 4,
                            "success_rate": 0.6667,
                            "cost_usd": 0.371,
                            "cost_per_successful_run_usd": 0.0928,
                        },
                        {
                            **FIGURES_EXAMPLE,
                            "group": "Deploy review",
                            "runs": 5,
                            "finished": 4,
                            "completed": 4,
                            "success_rate": 1.0,
                            "cost_usd": 0.041,
                            "cost_per_successful_run_usd": 0.0103,
                            "approval_wait_p50_seconds": None,
                            "approval_wait_p95_seconds": None,
                        },
                    ],  # fmt: skip
                    "by_project": [{**FIGURES_EXAMPLE, "group": "Default"}],
                    "top_failing_tools": [["email.send", 2], ["tickets.create", 1]],
                    "top_failing_agents": [["incident-worker", 2]],
                }
            ]
        }
    )

    days: int
    since: datetime
    total: FiguresOut
    by_day: list[FiguresOut]
    by_workflow: list[FiguresOut]
    by_project: list[FiguresOut]
    top_failing_tools: list[tuple[str, int]]
    top_failing_agents: list[tuple[str, int]]
    usage: CostOverTimeOut | None = Field(None, description="Cost and tokens per agent and per model, per day or week")


def _usage_group(row, periods) -> dict:
    return {
        "name": row.label, "calls": row.calls, "tokens": row.tokens, "cost_usd": row.cost_micros / 1_000_000,
        "per_period": [{"tokens": t, "cost_usd": c / 1_000_000} for t, c in row.series(periods)],
    }  # fmt: skip


def _usage_out(usage) -> dict:
    return {
        "grain": usage.grain, "periods": usage.periods,
        "by_agent": [_usage_group(r, usage.periods) for r in usage.by_agent],
        "by_model": [_usage_group(r, usage.periods) for r in usage.by_model],
    }  # fmt: skip


def _figures(f: Figures) -> dict:
    return {
        "group": f.label,
        "runs": f.runs,
        "finished": f.finished,
        "completed": f.completed,
        "success_rate": f.success_rate,
        "cost_usd": f.cost_micros / 1_000_000,
        "cost_per_successful_run_usd": None if f.cost_per_success is None else f.cost_per_success / 1_000_000,
        "failed_runs_cost_usd": f.failed_cost_micros / 1_000_000,
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
    days: QueryWhole(ge=1, le=366) = Query(default=30),  # noqa: B008
    workflow: str | None = Query(default=None, max_length=64),  # noqa: B008
    project: str | None = Query(default=None, max_length=64),  # noqa: B008
    grain: Literal["day", "week"] = Query(default="day"),  # noqa: B008
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
        grain=grain,
    )
    return {
        "usage": _usage_out(data.usage),
        "days": data.days,
        "since": data.since,
        "total": _figures(data.total),
        "by_day": [_figures(f) for f in data.by_day],
        "by_workflow": [_figures(f) for f in data.by_workflow],
        "by_project": [_figures(f) for f in data.by_project],
        "top_failing_tools": data.top_tools,
        "top_failing_agents": data.top_agents,
    }
