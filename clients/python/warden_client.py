"""A small typed client of Warden's integration API (httpx only), for agents that run elsewhere.

    client = WardenClient("http://127.0.0.1:8000", token="wdn_…")
    run = client.run_start("external-agent", goal="Refund the duplicate charge", idempotency_key="ticket-4711")
    client.task_open(run.id, "refunds", agent="billing-agent")
    op = client.operation_intent(run.id, task="refunds", step=1, tool="payments.refund",
                                 arguments={"charge": "ch_1"}, tool_class="non_idempotent_write",
                                 reversibility="irreversible")
    op = client.operation_wait(op.id)           # long-polls while a reviewer decides
    if op.status == "approved":
        client.operation_start(op.id)           # the approval is checked again now
        receipt = provider.refund(..., idempotency_key=op.idempotency_key)
        client.operation_outcome(op.id, committed=True, result=receipt)

Every write carries an ``Idempotency-Key`` (given, or derived from its arguments), so a client that
retries after a timeout never does anything twice; errors raise ``WardenError`` with the API's code.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx


class WardenError(Exception):
    def __init__(self, status: int, code: str, message: str, errors: list | None = None):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.errors = status, code, message, errors or []


@dataclass
class Run:
    id: int
    kind: str
    status: str
    status_reason: str
    raw: dict = field(repr=False)


@dataclass
class Operation:
    id: int
    idempotency_key: str
    status: str
    status_reason: str
    approval_id: int | None
    result: Any
    raw: dict = field(repr=False)

    @property
    def decided(self) -> bool:
        return self.status not in ("awaiting_approval", "proposed")


def _run(data: dict) -> Run:
    return Run(data["id"], data.get("kind", ""), data["status"], data["status_reason"], data)


def _operation(data: dict) -> Operation:
    return Operation(
        data["id"], data["idempotency_key"], data["status"], data["status_reason"], data["approval_id"],
        data.get("result"), data,
    )  # fmt: skip


class WardenClient:
    def __init__(self, base_url: str, token: str, *, timeout: float = 40.0, transport=None):
        self.http = httpx.Client(
            base_url=base_url.rstrip("/") + "/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> WardenClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- plumbing ---
    def _request(self, method: str, path: str, *, body: dict | None = None, key: str | None = None, **params):
        headers = {}
        if method == "POST":
            # A retried write with the same key replays the first answer (the server keeps it 72 h).
            headers["Idempotency-Key"] = (
                key or hashlib.sha256(f"{path}\n{json.dumps(body, sort_keys=True, default=str)}".encode()).hexdigest()
            )
        for attempt in range(5):
            response = self.http.request(method, path, json=body, params=params or None, headers=headers)
            if response.status_code == 429 or (response.status_code == 409 and "in_flight" in response.text):
                time.sleep(float(response.headers.get("Retry-After", 1)) * (attempt + 1))
                continue
            break
        if response.status_code >= 400:
            try:
                error = response.json()
            except ValueError:
                error = {"code": "error", "message": response.text[:500]}
            raise WardenError(
                response.status_code, error.get("code", "error"), error.get("message", ""), error.get("errors")
            )
        return response.json()

    # --- runs ---
    def run_start(
        self, workflow: str, *, goal: str = "", input: dict | None = None, idempotency_key: str | None = None
    ) -> Run:
        body = {"workflow": workflow, "goal": goal, "input": input or {}}
        return _run(self._request("POST", "/runs", body=body, key=idempotency_key))

    def run_get(self, run_id: int) -> Run:
        return _run(self._request("GET", f"/runs/{run_id}"))

    def run_finish(self, run_id: int, *, completed: bool = True, reason: str = "") -> Run:
        return _run(self._request("POST", f"/runs/{run_id}/finish", body={"completed": completed, "reason": reason}))

    # --- what the agent reports ---
    def task_open(self, run_id: int, key: str, *, agent: str, objective: str = "") -> dict:
        return self._request("POST", f"/runs/{run_id}/tasks", body={"key": key, "agent": agent, "objective": objective})

    def span_report(
        self, run_id: int, *, task: str, name: str, started_at: datetime, ended_at: datetime | None = None,
        kind: str = "model_call", tokens_in: int = 0, tokens_out: int = 0, cost_usd: float = 0.0,
        status: str = "ok", step: int | None = None, idempotency_key: str | None = None,
    ) -> int:  # fmt: skip
        body = {
            "task": task, "kind": kind, "name": name, "status": status, "step": step,
            "started_at": started_at.astimezone(UTC).isoformat(),
            "ended_at": (ended_at or started_at).astimezone(UTC).isoformat(),
            "tokens_in": tokens_in, "tokens_out": tokens_out, "cost_usd": cost_usd,
        }  # fmt: skip
        return self._request("POST", f"/runs/{run_id}/spans", body=body, key=idempotency_key)["id"]

    # --- side effects, through the ledger ---
    def operation_intent(
        self, run_id: int, *, task: str, step: int, tool: str, arguments: dict, tool_class: str,
        reversibility: str = "", undo: tuple[str, dict] | None = None,
    ) -> Operation:  # fmt: skip
        """``undo``: (tool, arguments) that undo the effect, carried out by this agent if an operator
        compensates the run (see ``undo_pending``)."""
        body = {
            "task": task, "step": step, "tool": tool, "arguments": arguments, "tool_class": tool_class,
            "reversibility": reversibility,
        }  # fmt: skip
        if undo is not None:
            body["undo"] = {"tool": undo[0], "arguments": undo[1]}
        return _operation(self._request("POST", f"/runs/{run_id}/operations", body=body))

    def undo_pending(self, run_id: int) -> list[Operation]:
        """After an operator compensated the run: the undo and approved corrections this agent is to carry
        out, in order. For each: ``operation_start``, the call (with its idempotency key), ``operation_outcome``."""
        ledger = self._request("GET", f"/runs/{run_id}/operations")
        return [
            _operation({**op, "approval_id": op.get("approval")})
            for op in ledger
            if op["kind"] in ("compensation", "correction") and op["status"] in ("approved", "executing")
        ]

    def operation_get(self, operation_id: int, *, wait: int = 0) -> Operation:
        return _operation(self._request("GET", f"/operations/{operation_id}", wait=wait))

    def operation_wait(self, operation_id: int, *, timeout: float = 3600, poll: int = 30) -> Operation:
        """Until a reviewer decides (or ``timeout`` seconds pass): each call waits up to ``poll`` s."""
        deadline = time.monotonic() + timeout
        while True:
            op = self.operation_get(operation_id, wait=max(0, min(poll, int(deadline - time.monotonic()))))
            if op.decided or time.monotonic() >= deadline:
                return op

    def operation_start(self, operation_id: int) -> Operation:
        return _operation(self._request("POST", f"/operations/{operation_id}/start", body={}))

    def operation_outcome(
        self, operation_id: int, *, committed: bool, result: Any = None, external_id: str = "", error: str = "",
        ambiguous: bool = False,
    ) -> Operation:  # fmt: skip
        body = {
            "committed": committed, "result": result, "external_id": external_id, "error": error,
            "ambiguous": ambiguous,
        }  # fmt: skip
        return _operation(self._request("POST", f"/operations/{operation_id}/outcome", body=body))
