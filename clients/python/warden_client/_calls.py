"""Each API call once: its method, path, body and how its answer is read. The sync and the async
clients send the same calls; only how they wait differs."""

from __future__ import annotations

import hashlib
import json
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from ._models import Operation, Run, WardenError, operation_of, run_of

T = TypeVar("T")


def _identity(data: Any) -> Any:
    return data


UNDOABLE = ("compensation", "correction")


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API call. A POST's Idempotency-Key is fixed when the call is made, so every retry of this call
    sends the same key (a lost answer is replayed, not done again) while the next call, even with the
    same body, is a new request: starting a workflow twice with the same input starts two runs."""

    method: str
    path: str
    body: dict | None = None
    key: str | None = None  # the caller's Idempotency-Key (to deduplicate across processes); else one is made
    params: dict = field(default_factory=dict)
    read: Callable[[Any], T] = _identity
    derived_key: bool = False  # the body names what it acts on: the key comes from path and body (see uses)

    def __post_init__(self) -> None:
        if self.method == "POST" and not self.key:
            object.__setattr__(self, "key", self._derived() if self.derived_key else uuid.uuid4().hex)

    def _derived(self) -> str:
        content = f"{self.path}\n{json.dumps(self.body, sort_keys=True, default=str)}"
        return hashlib.sha256(content.encode()).hexdigest()

    def headers(self) -> dict:
        return {"Idempotency-Key": self.key} if self.method == "POST" else {}


@dataclass(frozen=True)
class Retry:
    """When to send a call again, and after how long. Every POST carries its Idempotency-Key, so a
    retry never does anything twice: a lost answer is replayed, a request still in flight is waited for."""

    attempts: int = 5
    base_seconds: float = 0.5
    cap_seconds: float = 20.0

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        if retry_after is not None:
            try:
                return min(self.cap_seconds, max(0.0, float(retry_after)))
            except ValueError:
                pass
        return random.uniform(0, min(self.cap_seconds, self.base_seconds * 2**attempt))  # full jitter


def again(status: int, text: str) -> bool:
    """An answer worth sending the same request again for: rate limited, the key still in flight, or
    the server failing (a POST's key makes that safe)."""
    return status == 429 or status >= 500 or (status == 409 and "idempotency_key_in_flight" in text)


def answer(status: int, data_or_text) -> Any:
    """The answer's JSON, or WardenError with the API's code."""
    if status < 400:
        return data_or_text
    error = data_or_text if isinstance(data_or_text, dict) else {"code": "error", "message": str(data_or_text)[:500]}
    raise WardenError(status, error.get("code", "error"), error.get("message", ""), error.get("errors"))


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


# --- the calls ------------------------------------------------------------------------------------


def run_start(
    workflow: str, *, goal: str = "", input: dict | None = None, budget: dict | None = None,
    idempotency_key: str | None = None,
) -> Call[Run]:  # fmt: skip
    body = {"workflow": workflow, "goal": goal, "input": input or {}}
    if budget:  # max_steps, max_tokens, max_tool_calls, max_cost_usd, deadline_seconds
        body["budget"] = budget
    return Call("POST", "/runs", body, key=idempotency_key, read=run_of)


def run_get(run_id: int) -> Call[Run]:
    return Call("GET", f"/runs/{run_id}", read=run_of)


# The calls below with derived_key=True name what they act on (a run to finish, a task by its key, an
# operation by its run, task and step, or by its id): the same body is the same act whichever process
# sends it, so a key from path and body lets a restarted agent get the first answer back instead of a
# conflict. Everything else (a run start above all, a span) is a new thing each call: a fresh key.


def run_finish(run_id: int, *, completed: bool = True, reason: str = "") -> Call[Run]:
    body = {"completed": completed, "reason": reason}
    return Call("POST", f"/runs/{run_id}/finish", body, read=run_of, derived_key=True)


def task_open(run_id: int, key: str, *, agent: str, objective: str = "") -> Call[dict]:
    body = {"key": key, "agent": agent, "objective": objective}
    return Call("POST", f"/runs/{run_id}/tasks", body, derived_key=True)


def span_report(
    run_id: int, *, task: str, name: str, started_at: datetime, ended_at: datetime | None = None,
    kind: str = "model_call", tokens_in: int = 0, tokens_out: int = 0, cost_usd: float = 0.0,
    status: str = "ok", step: int | None = None, idempotency_key: str | None = None,
) -> Call[int]:  # fmt: skip
    body = {
        "task": task, "kind": kind, "name": name, "status": status, "step": step,
        "started_at": _iso(started_at), "ended_at": _iso(ended_at or started_at),
        "tokens_in": tokens_in, "tokens_out": tokens_out, "cost_usd": cost_usd,
    }  # fmt: skip
    return Call("POST", f"/runs/{run_id}/spans", body, key=idempotency_key, read=lambda data: data["id"])


def operation_intent(
    run_id: int, *, task: str, step: int, tool: str, arguments: dict, tool_class: str = "",
    reversibility: str = "", undo: tuple[str, dict] | None = None, idempotency_key: str | None = None,
) -> Call[Operation]:  # fmt: skip
    body = {"task": task, "step": step, "tool": tool, "arguments": arguments, "tool_class": tool_class,
            "reversibility": reversibility}  # fmt: skip
    if undo is not None:
        body["undo"] = {"tool": undo[0], "arguments": undo[1]}
    return Call("POST", f"/runs/{run_id}/operations", body, key=idempotency_key, read=operation_of, derived_key=True)


def operations(run_id: int) -> Call[list]:
    return Call("GET", f"/runs/{run_id}/operations")


def undo_pending(run_id: int) -> Call[list[Operation]]:
    def pending(ledger: list) -> list:
        return [
            operation_of(op) for op in ledger if op["kind"] in UNDOABLE and op["status"] in ("approved", "executing")
        ]

    return Call("GET", f"/runs/{run_id}/operations", read=pending)


def operation_get(operation_id: int, *, wait: int = 0) -> Call[Operation]:
    return Call("GET", f"/operations/{operation_id}", params={"wait": wait} if wait else {}, read=operation_of)


def operation_start(operation_id: int) -> Call[Operation]:
    return Call("POST", f"/operations/{operation_id}/start", {}, read=operation_of, derived_key=True)


def operation_outcome(
    operation_id: int, *, committed: bool, result: Any = None, external_id: str = "", error: str = "",
    ambiguous: bool = False,
) -> Call[Operation]:  # fmt: skip
    body = {"committed": committed, "result": result, "external_id": external_id, "error": error,
            "ambiguous": ambiguous}  # fmt: skip
    return Call("POST", f"/operations/{operation_id}/outcome", body, read=operation_of, derived_key=True)
