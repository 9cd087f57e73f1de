"""Shapes of what comes in from outside: a run's budget and its input (shared by API, forms, tests)."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class BudgetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_steps: int | None = Field(default=None, ge=1, le=1_000_000)
    max_tokens: int | None = Field(default=None, ge=1, le=10**12)
    max_tool_calls: int | None = Field(default=None, ge=0, le=1_000_000)
    max_cost_usd: float | None = Field(default=None, ge=0, le=1_000_000)
    deadline_seconds: int | None = Field(default=None, ge=1, le=30 * 24 * 3600)


class FaultIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1, max_length=64, pattern=r"^[-a-zA-Z0-9_]+$")
    at: Literal["call", "start"] = "call"
    call: int | None = Field(default=None, ge=1, le=10_000)
    mode: Literal["error", "transient", "timeout_after_commit", "slow", "crash"]
    # Where a crash happens around a tool call (default: after the intent is committed, before the call).
    point: Literal["", "after_intent", "after_call", "after_receipt", "after_advance", "after_enqueue"] = ""

    @model_validator(mode="after")
    def _call_needed(self):
        if self.at == "call" and self.call is None:
            raise ValueError("a fault at a tool call needs 'call' (1-based, within the task)")
        if self.at == "start" and self.mode != "crash":
            raise ValueError("only 'crash' can happen at a task's start")
        if self.point and self.mode != "crash":
            raise ValueError("'point' applies to a crash only")
        return self


class RunInputIn(BaseModel):
    """The keys the engine reads; a workflow may carry other keys of its own."""

    model_config = ConfigDict(extra="allow")

    faults: list[FaultIn] = Field(default_factory=list, max_length=50)
    propose_tools: list[str] = Field(default_factory=list, max_length=50)


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
