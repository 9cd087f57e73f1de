"""Warden's own memory tools (the run's blackboard): their names and argument shapes, which the model is
shown like any tool's. The engine carries them out (runs/blackboard.py)."""

from pydantic import BaseModel, ConfigDict, Field

WRITE, VERIFY = "blackboard.write", "blackboard.verify"
MEMORY_TOOLS = frozenset({WRITE, VERIFY})


class WriteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1, max_length=100, pattern=r"^[a-z0-9][a-z0-9._-]*$")
    kind: str = Field(pattern="^(text|number|flag|record|list)$")
    value: object
    expected_version: int = Field(ge=0, description="The latest version you read; 0 for a new key")
    sources: list[str] = Field(default_factory=list, max_length=20, description="Task keys whose artifacts it rests on")
    ttl_seconds: int | None = Field(default=None, ge=1, le=30 * 24 * 3600)


class VerifyArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1, max_length=100)
    version: int = Field(ge=1)
    verdict: str = Field(pattern="^(verified|rejected)$")
    note: str = Field(default="", max_length=1000)


TOOL_SCHEMAS = {
    WRITE: ("Record a fact for the run's other tasks (compare-and-set on the version)", WriteArgs),
    VERIFY: ("Verify or reject another task's blackboard entry", VerifyArgs),
}
