"""The synchronous client."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from . import _calls
from ._calls import Call, Retry, again, answer
from ._models import Operation

P = ParamSpec("P")
T = TypeVar("T")


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _sync(plan: Callable[P, Call[T]]) -> Callable[Concatenate[WardenClient, P], T]:
    @functools.wraps(plan)
    def method(self: WardenClient, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.send(plan(*args, **kwargs))

    return method


class WardenClient:
    """Warden's integration API for an agent that runs elsewhere (docs/integrations.md).

    Every POST carries an Idempotency-Key (the one given, else a fresh one per call, or for a call whose
    body names what it acts on one derived from it), so the client sends a request again after a timeout,
    a dropped connection, a 429, a 5xx or a key still in flight, and never does anything twice. Errors
    raise WardenError with the API's code."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 40.0, retry: Retry | None = None,
                 transport: httpx.BaseTransport | None = None):  # fmt: skip
        self.retry = retry or Retry()
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

    def send(self, call: Call[T]) -> T:
        for attempt in range(self.retry.attempts):
            last = attempt + 1 >= self.retry.attempts
            try:
                response = self.http.request(call.method, call.path, json=call.body, params=call.params or None,
                                             headers=call.headers())  # fmt: skip
            except httpx.TransportError:  # no answer: the same request, with the same key, again
                if last:
                    raise
                time.sleep(self.retry.delay(attempt))
                continue
            if again(response.status_code, response.text) and not last:
                time.sleep(self.retry.delay(attempt, response.headers.get("Retry-After")))
                continue
            return call.read(answer(response.status_code, _json(response)))
        raise AssertionError("unreachable")

    run_start = _sync(_calls.run_start)
    run_get = _sync(_calls.run_get)
    run_finish = _sync(_calls.run_finish)
    task_open = _sync(_calls.task_open)
    span_report = _sync(_calls.span_report)
    operation_intent = _sync(_calls.operation_intent)
    operations = _sync(_calls.operations)
    undo_pending = _sync(_calls.undo_pending)
    operation_get = _sync(_calls.operation_get)
    operation_start = _sync(_calls.operation_start)
    operation_outcome = _sync(_calls.operation_outcome)

    def operation_wait(self, operation_id: int, *, timeout: float = 3600, poll: int = 30) -> Operation:
        """Until a reviewer decides, or ``timeout`` seconds pass; each request waits up to ``poll`` s."""
        deadline = time.monotonic() + timeout
        while True:
            op = self.operation_get(operation_id, wait=max(0, min(poll, int(deadline - time.monotonic()))))
            if op.decided or time.monotonic() >= deadline:
                return op
