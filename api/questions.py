"""Integration API for agents' questions to people (human.ask): list them, read one, answer it."""

from datetime import datetime
from typing import Literal

from ninja import Field, Query, Router, Schema
from pydantic import ConfigDict

from api.schemas import BodyIn
from approvals.models import Question
from approvals.questions import question_answer
from core.errors import NotFound
from core.schemas import PathId, QueryWhole
from tenancy.access import authorize, authorize_token, visible_rows

router = Router(tags=["questions"])


class QuestionOut(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": 7,
                    "run": 57,
                    "task": "ask",
                    "step": 2,
                    "operation": 91,
                    "text": "Which release window should the checkout deployment use?",
                    "choices": ["tonight", "tomorrow morning", "next week"],
                    "status": "answered",
                    "on_timeout": "tell_agent",
                    "answer": "tonight",
                    "answered_by": "grace",
                    "answered_at": "2026-03-14T09:36:47.015Z",
                    "created_at": "2026-03-14T09:31:04.882Z",
                    "expires_at": "2026-03-15T09:31:04.882Z",
                }
            ]
        }
    )

    id: int
    run: int
    task: str
    step: int
    operation: int | None
    text: str
    choices: list[str] = Field(description="Empty: a free-text answer; otherwise the answer is one of these")
    status: str
    on_timeout: str = Field(description="What expiry does: tell_agent (it goes on without) or fail_task")
    answer: str
    answered_by: str | None
    answered_at: datetime | None
    created_at: datetime
    expires_at: datetime | None


def question_out(q: Question) -> dict:
    return {
        "id": q.id,
        "run": q.run_id,
        "task": q.task.key,
        "step": q.step,
        "operation": q.operation_id,
        "text": q.text,
        "choices": q.choices or [],
        "status": q.status,
        "on_timeout": q.on_timeout,
        "answer": q.answer,
        "answered_by": q.answered_by.get_username() if q.answered_by_id else None,
        "answered_at": q.answered_at,
        "created_at": q.created_at,
        "expires_at": q.expires_at,
    }


def _rows():
    return Question.objects.select_related("task", "answered_by")


class QuestionsQuery(Schema):
    status: Literal["pending", "answered", "expired", "withdrawn"] | None = "pending"
    run: QueryWhole(ge=1) | None = None


@router.get("/questions", response=list[QuestionOut], summary="Agents' questions to people (pending by default)")
def list_questions(request, filters: Query[QuestionsQuery]):
    authorize_token(request.auth, "read", what="questions", request=request)
    rows = visible_rows(_rows(), request.auth.user, field="run__project_id")  # only the caller's projects
    if filters.status:
        rows = rows.filter(status=filters.status)
    if filters.run:
        rows = rows.filter(run_id=filters.run)
    return [question_out(q) for q in rows.order_by("id")[:500]]


def _project_of(question_id: int) -> int:
    project_id = Question.objects.filter(id=question_id).values_list("run__project_id", flat=True).first()
    if project_id is None:
        raise NotFound(f"question {question_id} does not exist")
    return project_id


@router.get("/questions/{question_id}", response=QuestionOut, summary="One question")
def get_question(request, question_id: PathId):
    what = f"question {question_id}"
    authorize(request.auth.user, _project_of(question_id), "view", what=what, token=request.auth, request=request)
    return question_out(_rows().get(id=question_id))


class AnswerIn(BodyIn):
    model_config = ConfigDict(json_schema_extra={"examples": [{"answer": "tonight"}]})

    answer: str = Field(min_length=1, max_length=4000, description="Free text, or exactly one of the choices")


@router.post("/questions/{question_id}/answer", response=QuestionOut, summary="Answer a question")
def answer_question(request, question_id: PathId, payload: AnswerIn):
    what = f"question {question_id}"
    authorize(request.auth.user, _project_of(question_id), "decide", what=what, token=request.auth, request=request)
    question_answer(question_id=question_id, user=request.auth.user, answer=payload.answer, request=request)
    return question_out(_rows().get(id=question_id))
