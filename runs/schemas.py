"""Shapes of what comes in from outside: a run's budget and its input (shared by API, forms, tests)."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agents.schemas import PLAN_OUTPUT_SCHEMA, BudgetIn, PlanIn, PlannedTaskIn  # noqa: F401  (re-exported)
from core.schemas import DECIMAL, STRICT, PathId, QueryWhole, Whole  # noqa: F401  (re-exported for the API)


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
