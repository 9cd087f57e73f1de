"""Shapes of what comes in from outside: a run's budget and its input (shared by API, forms, tests)."""

import re
from typing import Annotated, Literal

from ninja import Schema
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

# Input from outside is taken as the OpenAPI schema states it: no coercion (false is not 0, "5" is not 5)
# and no unknown fields, which are usually a client's typo that would otherwise be silently ignored.
STRICT = ConfigDict(strict=True, extra="forbid")


def _integral(value):
    return int(value) if isinstance(value, float) and value.is_integer() else value


def Whole(ge: int | None = None, le: int | None = None):
    """An integer field of a request body. JSON Schema counts 3.0 as an integer, and some encoders write whole
    numbers that way; 3.5 stays an error. The bounds sit inside so the OpenAPI schema states them."""
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_integral)]


def _decimal_text(value):
    if isinstance(value, str) and not DECIMAL.fullmatch(value):
        raise ValueError("should be a whole number in decimal digits")
    return value


DECIMAL = re.compile(r"-?[0-9]+(\.0+)?")  # "3.0" is an integer to JSON Schema too


def QueryWhole(ge: int | None = None, le: int | None = None):
    """An integer query parameter: plain digits only ("1_000" and " 7 " are refused, where pydantic's lax
    parsing of text would take them)."""
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_decimal_text)]


# An id in the path, as digits (pydantic would take "1_0" for 10).
PathId = Annotated[int, BeforeValidator(_decimal_text)]


class BodyIn(Schema):
    """The base of every API request body."""

    model_config = STRICT


class BudgetIn(BaseModel):
    model_config = STRICT

    max_steps: Whole(ge=1, le=1_000_000) | None = None
    max_tokens: Whole(ge=1, le=10**12) | None = None
    max_tool_calls: Whole(ge=0, le=1_000_000) | None = None
    max_cost_usd: float | None = Field(default=None, ge=0, le=1_000_000)
    deadline_seconds: Whole(ge=1, le=30 * 24 * 3600) | None = None


class FaultIn(BaseModel):
    model_config = STRICT

    task: str = Field(min_length=1, max_length=64, pattern=r"^[-a-zA-Z0-9_]+$")
    at: Literal["call", "start"] = "call"
    call: Whole(ge=1, le=10_000) | None = None
    mode: Literal["error", "transient", "timeout_after_commit", "timeout_no_lookup", "slow", "crash", "freeze"]
    # Where a crash (or a freeze: the worker stops there a few seconds, for fencing drills) happens around a
    # tool call (default: after the intent is committed, before the call).
    point: Literal["", "after_intent", "after_call", "after_receipt", "after_advance", "after_enqueue"] = ""

    @model_validator(mode="after")
    def _call_needed(self):
        if self.at == "call" and self.call is None:
            raise ValueError("a fault at a tool call needs 'call' (1-based, within the task)")
        if self.at == "start" and self.mode != "crash":
            raise ValueError("only 'crash' can happen at a task's start")
        if self.point and self.mode not in ("crash", "freeze"):
            raise ValueError("'point' applies to a crash or a freeze only")
        if self.mode == "freeze" and self.point not in ("", "after_intent"):
            raise ValueError("a freeze happens after the intent is committed (point after_intent)")
        return self


class RunInputIn(BaseModel):
    """The keys the engine reads; a workflow may carry other keys of its own."""

    model_config = ConfigDict(extra="allow")

    faults: list[FaultIn] = Field(default_factory=list, max_length=50)
    propose_tools: list[str] = Field(default_factory=list, max_length=50)
    # A ModelVersion's slug: the run's agents as that version changes them (reference evaluations).
    model_version: str | None = Field(default=None, max_length=64)


class PlannedTaskIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1, max_length=64, pattern=r"^[-a-zA-Z0-9_]+$")
    agent: str = Field(min_length=1, max_length=64)
    objective: str = Field(min_length=1, max_length=4000)
    depends_on: list[str] = Field(default_factory=list, max_length=200)
    budget: BudgetIn = Field(default_factory=BudgetIn)


class PlanIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tasks: list[PlannedTaskIn] = Field(min_length=1)


PLAN_OUTPUT_SCHEMA = {
    "type": "object",
    "required": ["tasks"],
    "properties": {
        "tasks": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["key", "agent", "objective"],
                "properties": {
                    "key": {"type": "string"},
                    "agent": {"type": "string"},
                    "objective": {"type": "string"},
                    "depends_on": {"type": "array", "items": {"type": "string"}},
                },
            },
        }
    },
}
