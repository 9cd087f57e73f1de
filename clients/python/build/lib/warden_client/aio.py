"""The asynchronous client: the same calls as WardenClient, awaited."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Concatenate, ParamSpec, TypeVar

import httpx

from . import _calls
from ._calls import Call, Retry, again, answer
from ._models import Operation
from .client import _json

P = ParamSpec("P")
T = TypeVar("T")


def _async(plan: Callable[P, Call[T]]) -> Callable[Concatenate[AsyncWardenClient, P], Awaitable[T]]:
    @functools.wraps(plan)
    async def method(self: AsyncWardenClient, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.send(plan(*args, **kwargs))

    return method


class AsyncWardenClient:
    """WardenClient for asyncio code: ``async with AsyncWardenClient(url, token) as warden: ...``."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 40.0, retry: Retry | None = None,
                 transport: httpx.AsyncBaseTransport | None = None):  # fmt: skip
        self.retry = retry or Retry()
        self.http = httpx.AsyncClient(
            base_url=base_url.rstrip("/") + "/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncWardenClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def send(self, call: Call[T]) -> T:
        for attempt in range(self.retry.attempts):
            last = attempt + 1 >= self.retry.attempts
            try:
                response = await self.http.request(call.method, call.path, json=call.body,
                                                   params=call.params or None, headers=call.headers())  # fmt: skip
            except httpx.TransportError:
                if last:
                    raise
                await asyncio.sleep(self.retry.delay(attempt))
                continue
            if again(response.status_code, response.text) and not last:
                await asyncio.sleep(self.retry.delay(attempt, response.headers.get("Retry-After")))
                continue
            return call.read(answer(response.status_code, _json(response)))
        raise AssertionError("unreachable")

    run_start = _async(_calls.run_start)
    run_get = _async(_calls.run_get)
    run_finish = _async(_calls.run_finish)
    task_open = _async(_calls.task_open)
    span_report = _async(_calls.span_report)
    operation_intent = _async(_calls.operation_intent)
    operations = _async(_calls.operations)
    undo_pending = _async(_calls.undo_pending)
    operation_get = _async(_calls.operation_get)
    operation_start = _async(_calls.operation_start)
    operation_outcome = _async(_calls.operation_outcome)

    async def operation_wait(self, operation_id: int, *, timeout: float = 3600, poll: int = 30) -> Operation:
        deadline = time.monotonic() + timeout
        while True:
            op = await self.operation_get(operation_id, wait=max(0, min(poll, int(deadline - time.monotonic()))))
            if op.decided or time.monotonic() >= deadline:
                return op
