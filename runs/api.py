"""Integration API for runs (bearer tokens): validate, call one service, return."""

from datetime import datetime
from typing import Any

from ninja import Field, Router, Schema, Status

from approvals.access import authorize, default_project
from approvals.models import Project

from .errors import NotFound
from .models import Run
from .schemas import BudgetIn
from .selectors import run_get
from .services import run_start

router = Router(tags=["runs"])


class RunIn(Schema):
    workflow: str = Field(min_length=1, max_length=64, examples=["deploy-review"])
    project: str | None = Field(default=None, max_length=64, description="Project slug; default: the workflow's")
    goal: str = Field(default="", max_length=4000)
    input: dict[str, Any] = Field(
        default_factory=dict,
        examples=[{"faults": [{"task": "worker-3", "call": 4, "mode": "timeout_after_commit"}]}],
    )
    budget: BudgetIn = Field(default_factory=BudgetIn)


class BudgetOut(Schema):
    max_steps: int | None
    max_tokens: int | None
    max_tool_calls: int | None
    max_cost_usd: float | None
    deadline: datetime | None


class UsageOut(Schema):
    steps: int
    tokens: int
    tool_calls: int
    cost_usd: float


class TaskOut(Schema):
    key: str
    agent: str
    status: str
    status_reason: str
    attempts: int
    max_attempts: int
    depends_on: list[str]


class RunOut(Schema):
    id: int
    project: str
    workflow: str
    goal: str
    status: str
    status_reason: str
    plan_version: int
    code_version: str
    input: dict[str, Any]
    budget: BudgetOut
    usage: UsageOut
    tasks: list[TaskOut]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


def run_out(run: Run) -> dict:
    return {
        "id": run.id,
        "project": run.project.slug,
        "workflow": run.workflow_id and run.workflow.slug,
        "goal": run.goal,
        "status": run.status,
        "status_reason": run.status_reason,
        "plan_version": run.plan_version,
        "code_version": run.code_version,
        "input": run.input,
        "budget": {
            "max_steps": run.max_steps,
            "max_tokens": run.max_tokens,
            "max_tool_calls": run.max_tool_calls,
            "max_cost_usd": run.max_cost_usd,
            "deadline": run.deadline,
        },
        "usage": {
            "steps": run.steps_used,
            "tokens": run.tokens_used,
            "tool_calls": run.tool_calls_used,
            "cost_usd": run.cost_usd,
        },
        "tasks": [
            {
                "key": t.key,
                "agent": t.agent_id and t.agent.slug,
                "status": t.status,
                "status_reason": t.status_reason,
                "attempts": t.attempts,
                "max_attempts": t.max_attempts,
                "depends_on": t.depends_on,
            }
            for t in run.tasks.all()
        ],
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
    }


def _project(slug: str | None, workflow: str) -> Project:
    if slug:
        project = Project.objects.filter(slug=slug).first()
        if project is None:
            raise NotFound(f"project {slug} does not exist")
        return project
    from agents.models import Workflow

    wf = Workflow.objects.filter(slug=workflow).select_related("project").first()
    return (wf.project if wf and wf.project_id else None) or default_project()


def run_for(request, run_id: int, action: str = "view") -> Run:
    """The run if the caller may ``action`` it; 404 when it does not exist or is another project's."""
    run = run_get(run_id=run_id)
    authorize(request.auth.user, run.project_id, action, what=f"run {run_id}", token=request.auth, request=request)
    return run


@router.post("/runs", response={201: RunOut}, summary="Start a run of a workflow")
def create_run(request, payload: RunIn):
    project = _project(payload.project, payload.workflow)
    authorize(
        request.auth.user, project.id, "start", what=f"project {project.slug}", token=request.auth, request=request
    )
    run = run_start(
        workflow=payload.workflow,
        input=payload.input,
        goal=payload.goal,
        budget=payload.budget.model_dump(exclude_none=True),
        started_by=request.auth.user,
        project=project,
    )
    return Status(201, run_out(run_get(run_id=run.id)))


@router.get("/runs/{run_id}", response=RunOut, summary="A run with its status, usage, budget and tasks")
def get_run(request, run_id: int):
    return run_out(run_for(request, run_id))
