"""human.ask: Warden's built-in tool by which an agent asks a person a question and waits for the answer.

Declared like any tool, so the gate, the allowlist and the ledger see it (a read: it changes nothing
outside Warden). The broker never calls it: it writes the intent, the approvals app records the question
in the same transaction, and the task parks without a worker. The person's answer is the call's receipt
(``answer_result``), so an attempt that resumes or is retried reads it back by key and never asks twice.
"""

import re
from typing import Annotated

from pydantic import Field, field_validator

from .kit import ToolArguments, ToolClass, ToolRefused, ToolResult, ToolSpec, declare

ASK = "human.ask"
ANSWER_LIMIT = 4000
DEADLINE_MAX_SECONDS = 7 * 24 * 3600
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class AskArgs(ToolArguments):
    question: str = Field(min_length=1, max_length=2000, description="What you want a person to tell you")
    choices: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list, max_length=10, description="The answers the person may pick from; empty: free text"
    )
    deadline_seconds: int | None = Field(
        default=None,
        ge=60,
        le=DEADLINE_MAX_SECONDS,
        description="How long to wait for an answer; default: the workflow's",
    )

    @field_validator("question")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the question is blank")
        return value

    @field_validator("choices")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("the choices must be distinct")
        if len(value) == 1:
            raise ValueError("give at least two choices, or none for a free-text answer")
        return value


class AskResult(ToolResult):
    answer: str


def answer_result(answer: str) -> dict:
    """The receipt of an answered question, as the model is shown it (bounded, no control characters)."""
    return {"answer": _CONTROL.sub("", answer)[:ANSWER_LIMIT]}


def _never_called(*_args, **_kwargs) -> dict:
    raise ToolRefused("human.ask is answered by a person; the broker never calls it")


SPEC = declare(
    ToolSpec(
        name=ASK,
        system="human",
        tool_class=ToolClass.READ_ONLY,
        reversibility="",
        arguments=AskArgs,
        result=AskResult,
        execute=_never_called,
        description="Ask a person a question (free text, or one of your choices) and wait for the answer",
        module=__name__,
    )
)
