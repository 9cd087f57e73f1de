"""The shapes of a plan (what a planner agent or a caller proposes) and of a task's budget."""

from pydantic import BaseModel, ConfigDict, Field

from core.schemas import STRICT, Whole


class BudgetIn(BaseModel):
    model_config = STRICT

    max_steps: Whole(ge=1, le=1_000_000) | None = None
    max_tokens: Whole(ge=1, le=10**12) | None = None
    max_tool_calls: Whole(ge=0, le=1_000_000) | None = None
    max_cost_usd: float | None = Field(default=None, ge=0, le=1_000_000)
    deadline_seconds: Whole(ge=1, le=30 * 24 * 3600) | None = None


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
