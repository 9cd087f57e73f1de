"""Warden for the OpenAI Agents SDK (``pip install "./clients/python[openai-agents]"``).

``WardenTools`` wraps an agent's function tools so that every call goes through Warden's gate, ledger
and approvals before it runs: the intent first; if the gate says so, the call waits for a reviewer (the
agent's run waits with it); a refusal or a rejection reaches the model as the tool's answer, and nothing
is called; after the call, its outcome is recorded. ``WardenTracing`` sends the SDK's spans (model calls
with their tokens, tool calls) to the Warden run as they end.

    from agents import Agent, Runner
    from agents.tracing import set_trace_processors
    from warden_client import WardenClient
    from warden_client.openai_agents import WardenTools, WardenTracing

    warden = WardenClient(url, token)
    run = warden.run_start("external-agent", goal="Refund the duplicate charge")
    warden.task_open(run.id, "billing", agent="billing-agent")
    refunds = {"payments.refund": ("non_idempotent_write", "irreversible")}
    tools = WardenTools(warden, run.id, "billing", classes=refunds)
    set_trace_processors([WardenTracing(warden, run.id, "billing")])
    agent = Agent(name="billing", tools=[tools.wrap(refund, name="payments.refund")], ...)
    Runner.run_sync(agent, "Refund ch_1")

Steps are numbered by the order of the agent's tool calls in this run. An agent restarted after a crash
that asks for the same calls in the same order gets the recorded answers of those already made: a
committed effect is never made twice. A call that was under way when the agent died is recorded as
ambiguous (a person checks) rather than made again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import threading
import uuid
from datetime import datetime
from typing import Any

from agents.tracing import TracingProcessor
from agents.tracing.span_data import FunctionSpanData, GenerationSpanData, ResponseSpanData

from agents import FunctionTool

from .client import WardenClient

DEFAULT_CLASS = ("non_idempotent_write", "irreversible")  # an unknown tool is the most dangerous kind


def _answer(result: Any) -> str:
    return result if isinstance(result, str) else json.dumps(result, default=str)


def _recordable(result: Any) -> Any:
    try:
        json.dumps(result)
        return result
    except (TypeError, ValueError):
        return str(result)


class WardenTools:
    """Wraps function tools so that each call goes through Warden first (see the module's docstring).

    ``classes``: what each tool does, by Warden's name, as (tool_class, reversibility); it counts only
    where it is stricter than what Warden's registry or the project says, and a tool named nowhere is
    treated as a non-idempotent irreversible write (it waits for a reviewer)."""

    def __init__(self, client: WardenClient, run_id: int, task: str, *, classes: dict | None = None,
                 wait_seconds: float = 3600):  # fmt: skip
        self.client, self.run_id, self.task = client, run_id, task
        self.classes, self.wait_seconds = dict(classes or {}), wait_seconds
        self._steps, self._lock = itertools.count(1), threading.Lock()
        # This process's own requests: a retry after a lost answer replays the first answer; a restarted
        # agent's request (another nonce) reads the operation as it is now.
        self._nonce = uuid.uuid4().hex

    def _next_step(self) -> int:
        with self._lock:
            return next(self._steps)

    def wrap(self, tool: FunctionTool, *, name: str | None = None) -> FunctionTool:
        """The same tool for the model (name, description, schema), through Warden. ``name``: Warden's
        name for it (e.g. payments.refund), when it differs from the model's."""
        warden_name = name or tool.name
        tool_class, reversibility = self.classes.get(warden_name, DEFAULT_CLASS)

        async def invoke(context, arguments_json: str):
            arguments = json.loads(arguments_json or "{}")
            step = self._next_step()
            op = await asyncio.to_thread(
                self.client.operation_intent, self.run_id, task=self.task, step=step, tool=warden_name,
                arguments=arguments, tool_class=tool_class, reversibility=reversibility,
                idempotency_key=f"{self._nonce}:{self.run_id}:{self.task}:{step}",
            )  # fmt: skip
            return await self._carry_out(op, tool, context, arguments_json, warden_name)

        return dataclasses.replace(tool, on_invoke_tool=invoke)

    async def _carry_out(self, op, tool: FunctionTool, context, arguments_json: str, warden_name: str):
        if op.status == "committed":  # made before this agent restarted: its answer, not a second call
            return _answer(op.result)
        if op.status == "executing" and not op.created:  # under way when an earlier process of the agent died
            return await self._unknown(op, warden_name)
        if not op.decided:
            op = await asyncio.to_thread(self.client.operation_wait, op.id, timeout=self.wait_seconds)
        if op.status == "approved":
            op = await asyncio.to_thread(self.client.operation_start, op.id)
        if op.status != "executing":
            why = op.status_reason or ("no reviewer decided in time" if not op.decided else op.status)
            return f"Warden did not allow {warden_name}: {why}. Nothing was done."
        try:
            result = await tool.on_invoke_tool(context, arguments_json)
        except Exception as exc:
            await asyncio.to_thread(self.client.operation_outcome, op.id, committed=False, error=str(exc)[:1000])
            raise
        await asyncio.to_thread(self.client.operation_outcome, op.id, committed=True, result=_recordable(result))
        return result

    async def _unknown(self, op, warden_name: str) -> str:
        await asyncio.to_thread(self.client.operation_outcome, op.id, committed=False, ambiguous=True,
                                error="the agent restarted while this call was under way")  # fmt: skip
        return f"{warden_name} may or may not have been done before a restart; a person will check. Do not retry it."


def _moment(value: str | None) -> datetime:
    return datetime.fromisoformat(value) if value else datetime.now().astimezone()


class WardenTracing(TracingProcessor):
    """The SDK's model calls and tool calls, reported to the Warden run as they end (each once)."""

    def __init__(self, client: WardenClient, run_id: int, task: str):
        self.client, self.run_id, self.task = client, run_id, task

    def on_span_end(self, span) -> None:
        data = span.span_data
        usage: dict = {}
        if isinstance(data, GenerationSpanData):
            kind, name, usage = "model_call", data.model or "model", data.usage or {}
        elif isinstance(data, ResponseSpanData) and data.response is not None:
            response = data.response
            kind, name = "model_call", getattr(response, "model", "") or "model"
            raw = getattr(response, "usage", None)
            usage = {"input_tokens": getattr(raw, "input_tokens", 0), "output_tokens": getattr(raw, "output_tokens", 0)}
        elif isinstance(data, FunctionSpanData):
            kind, name = "tool_call", data.name
        else:
            return
        self.client.span_report(
            self.run_id, task=self.task, kind=kind, name=str(name)[:200], started_at=_moment(span.started_at),
            ended_at=_moment(span.ended_at), tokens_in=int(usage.get("input_tokens") or 0),
            tokens_out=int(usage.get("output_tokens") or 0), status="error" if span.error else "ok",
            idempotency_key=f"openai-agents-span:{self.run_id}:{span.span_id}",
        )  # fmt: skip

    def on_trace_start(self, trace) -> None:
        pass

    def on_trace_end(self, trace) -> None:
        pass

    def on_span_start(self, span) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self) -> None:
        pass
