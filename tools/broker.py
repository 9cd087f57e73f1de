"""The minimal broker: the only path from a model's tool call to a sandbox system.

Refused or invalid calls come back to the model as a structured tool error and call nothing.
"""

from dataclasses import dataclass

from pydantic import ValidationError

from runs.errors import StepFailure, TransientFailure
from runs.faults import fault_fire_once, faults_at
from runs.models import Run, Task

from .registry import TOOLS, ToolClass


class ToolTimeout(Exception):
    """The call's deadline passed: the effect may or may not have happened."""


@dataclass
class ToolOutcome:
    result: dict | None = None
    error: dict | None = None  # {"code": ..., "message": ..., "fields": [...]}

    @property
    def body(self) -> dict:
        return {"result": self.result} if self.error is None else {"error": self.error}


def idempotency_key(*, run_id: int, task_key: str, step: int) -> str:
    """Derived from run, task and step, never from the attempt: a retry reuses it."""
    return f"warden:{run_id}:{task_key}:{step}"


def tool_call(
    *, run: Run, task: Task, step: int, call_number: int, name: str, arguments, resumed: bool = False
) -> ToolOutcome:
    """``resumed``: the model asked for this call in an earlier attempt, which may have made it before
    it was lost. A write the system does not deduplicate by key is then looked up before it is made."""
    spec = TOOLS.get(name)
    if spec is None:
        return ToolOutcome(error={"code": "unknown_tool", "message": f"there is no tool named {name!r}"})
    if name not in task.allowed_tools:
        return ToolOutcome(
            error={"code": "not_allowed", "message": f"tool {name!r} is not allowed for agent {task.agent_id}"}
        )
    try:
        args = spec.arguments.model_validate(arguments)
    except ValidationError as exc:
        fields = [{"field": ".".join(map(str, e["loc"])), "message": e["msg"]} for e in exc.errors()]
        return ToolOutcome(
            error={"code": "invalid_arguments", "message": f"invalid arguments for {name}", "fields": fields}
        )

    key = idempotency_key(run_id=run.id, task_key=task.key, step=step)
    for mode in faults_at(run.input, task.key, call=call_number):
        if mode == "error":
            raise StepFailure(f"{name} failed permanently (drill fault)", "permanent")
        if mode == "transient" and fault_fire_once(
            run_id=run.id, task_key=task.key, point=f"call:{call_number}", mode=mode
        ):
            raise TransientFailure(f"{name} failed transiently (drill fault)")
        if mode == "crash" and fault_fire_once(
            run_id=run.id, task_key=task.key, point=f"call:{call_number}", mode=mode
        ):
            from runs.faults import crash_now

            crash_now()
        if mode == "timeout_after_commit" and fault_fire_once(
            run_id=run.id, task_key=task.key, point=f"call:{call_number}", mode=mode
        ):
            spec.run(args, key)
            return _reconcile(spec, key)
    if resumed and spec.tool_class != ToolClass.READ_ONLY and not spec.honours_keys:
        if spec.lookup is None:
            raise StepFailure(
                f"{name} may have run before its worker was lost and has no status lookup: a human must check",
                "ambiguous",
            )
        found = spec.lookup(key)
        if found is not None:
            return ToolOutcome(result=found)
    return ToolOutcome(result=spec.run(args, key))


def _reconcile(spec, key: str) -> ToolOutcome:
    """After an ambiguous write, ask the system by key before anything else happens."""
    if spec.lookup is None:
        raise StepFailure(f"{spec.name} timed out and has no status lookup: a human must check", "ambiguous")
    found = spec.lookup(key)
    if found is not None:
        return ToolOutcome(result=found)
    raise TransientFailure(f"{spec.name} timed out and did not commit")
