"""Integration API for external agents (integrations/external.py): tasks, reported spans, the ledger's intent,
approval wait (long-poll), start, receipt or failure, and the end of the run. Writes need the token's
``run`` scope (and the starter's role in the project); reading an operation needs ``read``."""

import time
from datetime import datetime
from typing import Any, Literal

from ninja import Field, Query, Schema, Status
from pydantic import ConfigDict

from api.reads import router as reads_router
from api.runs import RunOut, run_for, run_out
from api.schemas import BodyIn
from core.errors import NotFound
from core.schemas import PathId, QueryWhole, Whole
from integrations import external
from runs.selectors import run_get
from tenancy.access import authorize
from tools.models import ToolOperation

# One router per path: the task listing (a read) and the task opening share /runs/{run_id}/tasks.
router = reads_router
WAIT_MAX_SECONDS = 30


class TaskOpenIn(BodyIn):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"key": "refund", "agent": "billing-agent", "objective": "Refund the duplicate charge of T-4711"}
            ]
        }
    )

    key: str = Field(min_length=1, max_length=64, pattern=r"^[-a-zA-Z0-9_]+$", examples=["refunds"])
    agent: str = Field(min_length=1, max_length=200, examples=["billing-agent"])
    objective: str = Field(default="", max_length=4000)


class TaskRefOut(Schema):
    model_config = ConfigDict(json_schema_extra={"examples": [{"id": 318, "key": "refund", "status": "running"}]})

    id: int
    key: str
    status: str


@router.post("/runs/{run_id}/tasks", response={201: TaskRefOut}, summary="Open a task of an external agent")
def open_task(request, run_id: PathId, payload: TaskOpenIn):
    run_for(request, run_id, "start")
    task = external.external_task_open(run_id=run_id, key=payload.key, agent=payload.agent, objective=payload.objective)
    return Status(201, {"id": task.id, "key": task.key, "status": task.status})


class SpanIn(BodyIn):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "task": "refund",
                    "kind": "model_call",
                    "name": "gpt-4.1-mini",
                    "started_at": "2026-03-14T09:31:02.114Z",
                    "ended_at": "2026-03-14T09:31:03.270Z",
                    "status": "ok",
                    "tokens_in": 420,
                    "tokens_out": 64,
                    "cost_usd": 0.0003,
                    "step": 1,
                }
            ]
        }
    )

    task: str = Field(min_length=1, max_length=64)
    kind: Literal["model_call", "tool_call", "plan"] = "model_call"
    name: str = Field(min_length=1, max_length=200, examples=["gpt-4.1-mini"])
    started_at: datetime = Field(strict=False)  # ISO 8601 text is how JSON carries a time
    ended_at: datetime | None = Field(default=None, strict=False)
    status: Literal["ok", "error"] = "ok"
    tokens_in: Whole(ge=0) = 0
    tokens_out: Whole(ge=0) = 0
    cost_usd: float = Field(default=0, ge=0, le=10_000)
    step: Whole(ge=1) | None = None


class SpanRefOut(Schema):
    model_config = ConfigDict(json_schema_extra={"examples": [{"id": 1207}]})

    id: int


@router.post("/runs/{run_id}/spans", response={201: SpanRefOut}, summary="Report a model call or step (with usage)")
def report_span(request, run_id: PathId, payload: SpanIn):
    run_for(request, run_id, "start")
    span = external.external_span_report(
        run_id=run_id,
        task=payload.task,
        kind=payload.kind,
        name=payload.name,
        started_at=payload.started_at,
        ended_at=payload.ended_at,
        status=payload.status,
        tokens_in=payload.tokens_in,
        tokens_out=payload.tokens_out,
        cost_micros=round(payload.cost_usd * 1_000_000),
        step=payload.step,
    )
    return Status(201, {"id": span.id})


class UndoIn(BodyIn):
    tool: str = Field(min_length=1, max_length=64, examples=["payments.refund_cancel"])
    arguments: dict[str, Any] = Field(default_factory=dict, examples=[{"refund": "re_1"}])


class IntentIn(BodyIn):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "task": "refund",
                    "step": 2,
                    "tool": "payments.refund",
                    "arguments": {"charge": "ch_T-4711", "amount": 1200},
                    "tool_class": "non_idempotent_write",
                    "reversibility": "irreversible",
                    "undo": {
                        "tool": "email.send",
                        "arguments": {"to": "billing@example.com", "subject": "Refund of T-4711 was sent in error"},
                    },
                }
            ]
        }
    )

    task: str = Field(min_length=1, max_length=64)
    step: Whole(ge=1) = Field(description="The agent's step: the key is derived from run, task and step")
    tool: str = Field(min_length=1, max_length=64, examples=["payments.refund"])
    arguments: dict[str, Any] = Field(default_factory=dict, examples=[{"charge": "ch_1", "amount": 1200}])
    tool_class: Literal["read_only", "idempotent_write", "non_idempotent_write"]
    reversibility: Literal["", "reversible", "irreversible"] = ""
    undo: UndoIn | None = Field(
        default=None,
        description="How this effect is undone (reversible) or corrected (otherwise), should an operator "
        "compensate the run: the agent carries it out then",
    )


class ExternalOperationOut(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": 88,
                    "run_id": 57,
                    "task": "refund",
                    "step": 2,
                    "tool": "payments.refund",
                    "idempotency_key": "warden:i3fa9c0b12:57:refund:2",
                    "status": "committed",
                    "status_reason": "",
                    "approval_id": 12,
                    "result": {"refund": "re_1", "charge": "ch_T-4711", "amount": 1200},
                    "external_id": "re_1",
                }
            ]
        }
    )

    id: int
    run_id: int
    task: str
    step: int | None
    tool: str
    idempotency_key: str = Field(description="Pass it to the provider: a retried call then cannot act twice")
    status: str = Field(description="awaiting_approval → approved → executing → committed | failed | ambiguous")
    status_reason: str
    approval_id: int | None
    result: Any = None
    external_id: str
    created: bool = Field(
        False, description="True when this request recorded the intent; false when it was there already (a rerun)"
    )


def operation_out(op: ToolOperation) -> dict:
    return {
        "id": op.id,
        "run_id": op.run_id,
        "task": op.task.key if op.task_id else "",
        "step": op.step,
        "tool": op.tool,
        "idempotency_key": op.idempotency_key,
        "status": op.status,
        "status_reason": op.status_reason,
        "approval_id": op.approval_id,
        "result": op.result,
        "external_id": op.external_id,
        "created": bool(getattr(op, "created", False)),
    }


def _operation_for(request, operation_id: int, action: str) -> ToolOperation:
    op = ToolOperation.objects.select_related("task").filter(id=operation_id).first()
    if op is None:
        raise NotFound(f"operation {operation_id} does not exist")
    run = run_get(run_id=op.run_id)
    authorize(
        request.auth.user, run.project_id, action, what=f"operation {operation_id}", token=request.auth, request=request
    )
    return op


@router.get("/operations/{operation_id}", response=ExternalOperationOut, summary="An operation (long-poll with wait)")
def get_operation(
    request,
    operation_id: PathId,
    wait: QueryWhole(ge=0, le=WAIT_MAX_SECONDS) = Query(default=0, description="Seconds to wait for a decision"),  # noqa: B008
):
    op = _operation_for(request, operation_id, "view")
    deadline = time.monotonic() + wait
    while op.status in (ToolOperation.Status.AWAITING_APPROVAL, ToolOperation.Status.PROPOSED):
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
        op.refresh_from_db()
    return operation_out(op)


@router.post("/operations/{operation_id}/start", response=ExternalOperationOut, summary="About to call the provider")
def start_operation(request, operation_id: PathId):
    _operation_for(request, operation_id, "start")
    return operation_out(external.external_operation_started(operation_id=operation_id))


class OutcomeIn(BodyIn):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "committed": True,
                    "result": {"refund": "re_1", "charge": "ch_T-4711", "amount": 1200},
                    "external_id": "re_1",
                }
            ]
        }
    )

    committed: bool = Field(description="The provider did it (a receipt); false: it did not, or see ambiguous")
    result: Any = None
    external_id: str = Field(default="", max_length=200)
    error: str = Field(default="", max_length=4000)
    ambiguous: bool = Field(default=False, description="The agent cannot tell whether it happened: a human checks")


@router.post(
    "/operations/{operation_id}/outcome", response=ExternalOperationOut, summary="Record the receipt or failure"
)
def operation_outcome(request, operation_id: PathId, payload: OutcomeIn):
    _operation_for(request, operation_id, "start")
    return operation_out(external.external_operation_outcome(operation_id=operation_id, **payload.dict()))


class FinishIn(BodyIn):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"completed": True, "reason": "refund re_1 issued for ticket T-4711"}]}
    )

    completed: bool = True
    reason: str = Field(default="", max_length=4000)


@router.post("/runs/{run_id}/finish", response=RunOut, summary="The external agent is done")
def finish_run(request, run_id: PathId, payload: FinishIn):
    run_for(request, run_id, "start")
    external.external_run_finish(run_id=run_id, completed=payload.completed, reason=payload.reason)
    return run_out(run_get(run_id=run_id))
