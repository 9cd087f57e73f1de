"""Integration API for runs (bearer tokens): validate, call one service, return."""

from datetime import datetime
from typing import Any

from ninja import Field, Query, Router, Schema, Status
from pydantic import ConfigDict

from agents.models import Workflow
from agents.selectors import workflow_visible
from api.schemas import BodyIn
from core.errors import InvalidInput, NotFound
from core.schemas import PathId, QueryWhole, Whole
from runs.models import Run, Task
from runs.schemas import BudgetIn
from runs.selectors import run_get
from runs.services import (
    run_cancel,
    run_fork,
    run_fork_preview,
    run_resume,
    run_start,
    task_retry,
    task_retry_from,
    workflow_unknown,
)
from tenancy.access import authorize, authorize_token, default_project, visible_rows
from tenancy.models import Project

router = Router(tags=["runs"])


class RunIn(BodyIn):
    # Merged with BodyIn's strict config by pydantic; the examples show in the OpenAPI schema.
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "workflow": "incident-fanout",
                    "project": "default",
                    "goal": "Handle the checkout incident for the affected customers",
                    "input": {"faults": [{"task": "worker-3", "call": 4, "mode": "timeout_after_commit"}]},
                    "budget": {"max_steps": 200, "max_cost_usd": 5.0, "deadline_seconds": 3600},
                }
            ]
        }
    )

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
    agent_version: int | None = Field(
        None, description="The version of the agent this task runs on: the one the run started with"
    )


class VersionRefOut(Schema):
    id: int
    version: int


class PolicyRefOut(Schema):
    id: int
    name: str
    digest: str = Field(description="Of the policy's settings when the run started: a later edit shows as another")


class VersionsOut(Schema):
    workflow: VersionRefOut | None = None
    agents: dict[str, VersionRefOut] = Field(default_factory=dict)
    policies: list[PolicyRefOut] = Field(default_factory=list)


RUN_EXAMPLE = {
    "id": 42,
    "kind": "workflow",
    "project": "default",
    "workflow": "deploy-review",
    "goal": "Assess the checkout deployment",
    "status": "running",
    "status_reason": "",
    "plan_version": 1,
    "code_version": "warden-0.1.0",
    "input": {"faults": [], "propose_tools": []},
    "budget": {
        "max_steps": 50,
        "max_tokens": 20000,
        "max_tool_calls": None,
        "max_cost_usd": 1.0,
        "deadline": "2026-03-14T10:12:03.412Z",
    },
    "usage": {"steps": 4, "tokens": 1830, "tool_calls": 1, "cost_usd": 0.0021},
    "tasks": [
        {
            "key": "inventory",
            "agent": "inventory-agent",
            "status": "completed",
            "status_reason": "",
            "attempts": 1,
            "max_attempts": 2,
            "depends_on": [],
            "agent_version": 3,
        },
        {
            "key": "risk",
            "agent": "risk-agent",
            "status": "retry_wait",
            "status_reason": "model timeout",
            "attempts": 1,
            "max_attempts": 2,
            "depends_on": [],
        },
        {
            "key": "verify",
            "agent": "verifier-agent",
            "status": "pending",
            "status_reason": "",
            "attempts": 0,
            "max_attempts": 1,
            "depends_on": ["inventory", "risk"],
        },
    ],
    "created_at": "2026-03-14T09:12:03.412Z",
    "started_at": "2026-03-14T09:12:03.412Z",
    "finished_at": None,
    "pruned_at": None,
    "versions": {
        "workflow": {"id": 7, "version": 2},
        "agents": {"inventory-agent": {"id": 31, "version": 3}},
        "policies": [{"id": 1, "name": "deploys need a reviewer", "digest": "9f1c2e7a0b3d4c5e"}],
    },
}


class ForkedFromOut(Schema):
    run: int | None = Field(description="The run it was forked from (null if that run was deleted since)")
    task: str
    step: int


class RunOut(Schema):
    model_config = ConfigDict(json_schema_extra={"examples": [RUN_EXAMPLE]})

    id: int
    kind: str = Field(description="workflow (Warden's workers run it) or external (an agent reports it)")
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
    pruned_at: datetime | None = Field(
        description="When retention removed the run's step bodies and payloads; ledger, decisions and figures stay"
    )
    versions: VersionsOut = Field(
        description="What the run started with and keeps to its end: its workflow's and agents' versions, and the "
        "approval policies then in force (empty for runs started before versions were recorded)"
    )
    forked_from: ForkedFromOut | None = Field(
        None, description="For a fork: the run, task and journal step it was forked from (POST /runs/{id}/fork)"
    )


def run_out(run: Run) -> dict:
    pinned = (run.versions or {}).get("agents") or {}
    return {
        "id": run.id,
        "kind": "external" if run.workflow.planner == "external" else "workflow",
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
                "agent_version": pinned.get(t.agent.slug, {}).get("version") if t.agent_id else None,
            }
            for t in run.tasks.all()
        ],
        "versions": run.versions or {},
        "forked_from": {"run": run.forked_from_id, "task": run.forked_task, "step": run.forked_step}
        if run.forked_task
        else None,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "pruned_at": run.pruned_at,
    }


def project_for(slug: str | None, workflow: Workflow | None) -> Project:
    """The project named by ``slug`` (404 when none), else the workflow's, else the default one."""
    if slug:
        project = Project.objects.filter(slug=slug).first()
        if project is None:
            raise NotFound(f"project {slug} does not exist")
        return project
    return (workflow.project if workflow and workflow.project_id else None) or default_project()


def run_for(request, run_id: int, action: str = "view") -> Run:
    """The run if the caller may ``action`` it; 404 when it does not exist or is another project's."""
    run = run_get(run_id=run_id)
    authorize(request.auth.user, run.project_id, action, what=f"run {run_id}", token=request.auth, request=request)
    return run


@router.post("/runs", response={201: RunOut}, summary="Start a run of a workflow")
def create_run(request, payload: RunIn):
    # A workflow of a project the caller is not in is as unknown as one that does not exist.
    workflow = workflow_visible(slug=payload.workflow, user=request.auth.user)
    project = project_for(payload.project, workflow)
    authorize(
        request.auth.user, project.id, "start", what=f"project {project.slug}", token=request.auth, request=request
    )
    if workflow is None:
        raise workflow_unknown(payload.workflow)
    run = run_start(
        workflow=payload.workflow,
        input=payload.input,
        goal=payload.goal,
        budget=payload.budget.model_dump(exclude_none=True),
        started_by=request.auth.user,
        project=project,
        via="api",
        request=request,
    )
    return Status(201, run_out(run_get(run_id=run.id)))


@router.get("/runs/{run_id}", response=RunOut, summary="A run with its status, usage, budget and tasks")
def get_run(request, run_id: PathId):
    return run_out(run_for(request, run_id))


class RunSummaryOut(Schema):
    id: int
    project: str
    workflow: str
    goal: str
    status: str
    status_reason: str
    usage: UsageOut
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class RunPageOut(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "items": [
                        {
                            "id": 43,
                            "project": "default",
                            "workflow": "incident-fanout",
                            "goal": "Handle the checkout incident for the affected customers",
                            "status": "needs_attention",
                            "status_reason": "task worker-3 failed (transient): no attempts left (3 made)",
                            "usage": {"steps": 38, "tokens": 41250, "tool_calls": 19, "cost_usd": 0.0612},
                            "created_at": "2026-03-14T09:20:41.006Z",
                            "started_at": "2026-03-14T09:20:41.006Z",
                            "finished_at": "2026-03-14T09:23:17.530Z",
                        },
                        {
                            "id": 42,
                            "project": "default",
                            "workflow": "deploy-review",
                            "goal": "Assess the checkout deployment",
                            "status": "running",
                            "status_reason": "",
                            "usage": {"steps": 4, "tokens": 1830, "tool_calls": 1, "cost_usd": 0.0021},
                            "created_at": "2026-03-14T09:12:03.412Z",
                            "started_at": "2026-03-14T09:12:03.412Z",
                            "finished_at": None,
                        },
                    ],
                    "next_after": 42,
                }
            ]
        }
    )

    items: list[RunSummaryOut]
    next_after: int | None = Field(description="Pass as `after` for the next page; null on the last one")


def keyset_page(rows, *, after: int | None, limit: int) -> tuple[list, int | None]:
    """One page of ``rows`` (ordered by id, newest first) after the cursor, and the next cursor: no
    OFFSET, so a deep page costs what the first does."""
    if after:
        rows = rows.filter(id__lt=after)
    page = list(rows[: limit + 1])
    return page[:limit], (page[limit - 1].id if len(page) > limit else None)


@router.get("/runs", response=RunPageOut, summary="Runs of my projects, newest first (cursor pages)")
def list_runs(
    request,
    status: list[Run.Status] = Query(default=None, description="One or more statuses"),  # noqa: B008
    workflow: str | None = Query(default=None, max_length=64),  # noqa: B008
    project: str | None = Query(default=None, max_length=64),  # noqa: B008
    after: QueryWhole(ge=0) | None = Query(default=None, description="The `next_after` of the previous page"),  # noqa: B008
    limit: QueryWhole(ge=1, le=200) = Query(default=50),  # noqa: B008
):
    authorize_token(request.auth, "read", what="the run list", request=request)
    rows = visible_rows(Run.objects.select_related("workflow", "project").order_by("-id"), request.auth.user)
    if status:
        rows = rows.filter(status__in=status)
    if workflow:
        rows = rows.filter(workflow__slug=workflow)
    if project:
        rows = rows.filter(project__slug=project)
    page, next_after = keyset_page(rows, after=after, limit=limit)
    items = [
        {
            "id": run.id,
            "project": run.project.slug,
            "workflow": run.workflow.slug,
            "goal": run.goal,
            "status": run.status,
            "status_reason": run.status_reason,
            "usage": {
                "steps": run.steps_used,
                "tokens": run.tokens_used,
                "tool_calls": run.tool_calls_used,
                "cost_usd": run.cost_usd,
            },
            "created_at": run.created_at,
            "started_at": run.started_at,
            "finished_at": run.finished_at,
        }
        for run in page
    ]
    return {"items": items, "next_after": next_after}


class ReasonIn(BodyIn):
    model_config = ConfigDict(json_schema_extra={"examples": [{"reason": "the customer called it off"}]})

    reason: str = Field(default="", max_length=1000, examples=["the customer called it off"])


class RetryIn(ReasonIn):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"reason": "the CRM is back up; send the follow-up again", "from_step": 3}]}
    )

    from_step: Whole(ge=1) | None = Field(
        default=None,
        description="Re-execute from this journal step (earlier steps are replayed, later ones are made afresh "
        "under new idempotency keys). A committed effect at or after it is not made again: its receipt answers "
        "the same call. Omitted: a plain retry.",
    )
    repeat: list[Whole(ge=1)] = Field(
        default_factory=list,
        max_length=200,
        description="Steps (at or after from_step) whose committed effect must happen again: each one waits for "
        "a reviewer's approval before it is made. (Before, a retry from a step repeated every such effect: README.)",
    )


def _by(request) -> dict:
    """Who acts, for the services' audit rows."""
    return {"actor": request.auth.user, "via": "api", "request": request}


@router.post("/runs/{run_id}/cancel", response={202: RunOut}, summary="Cancel a run (cooperatively, then forced)")
def cancel_run(request, run_id: PathId, payload: ReasonIn):
    run = run_for(request, run_id, "operate")
    reason = payload.reason or f"cancelled by {request.auth.user} through the API"
    run_cancel(run_id=run_id, reason=reason, **_by(request))
    return Status(202, run_out(run_get(run_id=run.id)))


@router.post("/runs/{run_id}/resume", response=RunOut, summary="Resume a run that needs attention")
def resume_run(request, run_id: PathId, payload: ReasonIn):
    run = run_for(request, run_id, "operate")
    reason = payload.reason or f"resumed by {request.auth.user} through the API"
    run_resume(run_id=run_id, reason=reason, **_by(request))
    return run_out(run_get(run_id=run.id))


@router.post("/runs/{run_id}/tasks/{task_key}/retry", response=RunOut, summary="Retry a failed task")
def retry_task(request, run_id: PathId, task_key: str, payload: RetryIn):
    run = run_for(request, run_id, "operate")
    task = Task.objects.filter(run=run, key=task_key).first()
    if task is None:
        raise NotFound(f"run {run_id} has no task {task_key}")
    reason = payload.reason or f"retried by {request.auth.user} through the API"
    if payload.from_step is None and not payload.repeat:
        task_retry(task_id=task.id, reason=reason, **_by(request))
    elif payload.from_step is None:
        raise InvalidInput(
            "only a retry from a step repeats effects", [{"field": "repeat", "message": "needs from_step"}]
        )
    else:
        task_retry_from(task_id=task.id, step=payload.from_step, repeat=payload.repeat, reason=reason, **_by(request))
    return run_out(run_get(run_id=run.id))


class ForkIn(ReasonIn):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"task": "worker-3", "step": 8, "reason": "the mail server is back"}]}
    )

    task: str = Field(min_length=1, max_length=64, description="The key of the task to fork from")
    step: Whole(ge=1) = Field(description="The journal step of that task the fork runs afresh from")


class ForkTaskOut(Schema):
    key: str
    status: str = Field(description="In the source run")
    fate: str = Field(
        description="forked (steps before `step` replayed), starts_over (depends on the forked task), completed "
        "(kept, never runs), continues (goes on from its last step), stays (a replaced plan's)"
    )
    replayed_until: int = Field(description="The last journal step the fork keeps (0: none)")


class ForkStepOut(Schema):
    step: int
    kind: str
    name: str


class ForkCallOut(Schema):
    task: str
    step: int
    tool: str
    status_in_source: str
    operation: int = Field(description="The source run's operation at that step")


class ForkEffectOut(Schema):
    task: str
    step: int | None
    tool: str
    reversibility: str
    idempotency_key: str = Field(description="In the source run; the fork keys its copy with its own run id")
    operation: int
    replayed: bool = Field(description="Its step is replayed from the journal: never asked again")
    answers_again: bool = Field(description="Its step runs again: the receipt answers the same call")


FORK_PREVIEW_EXAMPLE = {
    "run_id": 43,
    "task": "worker-3",
    "step": 8,
    "refusal": "",
    "tasks": [
        {"key": "plan", "status": "completed", "fate": "completed", "replayed_until": 1},
        {"key": "worker-3", "status": "failed", "fate": "forked", "replayed_until": 7},
        {"key": "summary", "status": "pending", "fate": "starts_over", "replayed_until": 0},
    ],
    "replayed": [
        {"step": 6, "kind": "tool_call", "name": "crm.update"},
        {"step": 7, "kind": "model_call", "name": "scripted"},
    ],
    "new_calls": [
        {"task": "worker-3", "step": 8, "tool": "email.send", "status_in_source": "failed", "operation": 219}
    ],
    "inherited_effects": [
        {
            "task": "worker-3",
            "step": 4,
            "tool": "tickets.create",
            "reversibility": "reversible",
            "idempotency_key": "warden:5f2c9a:43:worker-3:4",
            "operation": 211,
            "replayed": True,
            "answers_again": False,
        }
    ],
}


class ForkPreviewOut(Schema):
    model_config = ConfigDict(json_schema_extra={"examples": [FORK_PREVIEW_EXAMPLE]})

    run_id: int
    task: str
    step: int
    refusal: str = Field(description="Why the fork would be refused now (the run's state); empty when it would go")
    tasks: list[ForkTaskOut]
    replayed: list[ForkStepOut] = Field(description="The forked task's journal steps replayed")
    new_calls: list[ForkCallOut] = Field(
        description="The calls the fork would make anew, as the source made them (a model asked again may ask "
        "otherwise; such calls are made anew too)"
    )
    inherited_effects: list[ForkEffectOut] = Field(description="Committed effects inherited: not repeated")


@router.get(
    "/runs/{run_id}/fork-preview", response=ForkPreviewOut, summary="What forking a run from a task's step would do"
)
def fork_preview(request, run_id: PathId, task: str = Query(..., max_length=64), step: QueryWhole(ge=1) = Query(...)):  # noqa: B008
    run = run_for(request, run_id, "operate")
    return run_fork_preview(run_id=run.id, task_key=task, step=step, strict=True)


@router.post("/runs/{run_id}/fork", response={201: RunOut}, summary="Fork a run from a task's step into a new run")
def fork_run(request, run_id: PathId, payload: ForkIn):
    run = run_for(request, run_id, "operate")
    reason = payload.reason or f"forked by {request.auth.user} through the API"
    fork = run_fork(run_id=run.id, task_key=payload.task, step=payload.step, reason=reason, **_by(request))
    return Status(201, run_out(run_get(run_id=fork.id)))
