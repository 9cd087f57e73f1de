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

A call's step in Warden's ledger is what the call is (Warden's name of the tool, its canonical arguments,
and how many such calls the task made before), not its order and not the model's tool-call id: an agent
restarted after a crash, whose model asks again with fresh ids and in another order, gets the recorded
answers of the calls already made, and a committed effect is never made twice. A call that was under way
when the agent died is made again with the same key if the tool says its service deduplicates by it
(``wrap(..., deduplicates=True)``), otherwise recorded as ambiguous (a person checks) and not made again.

The wrapped tool receives Warden's idempotency key: ``warden_client.current_idempotency_key()`` while it
runs, and as the keyword argument ``idempotency_key`` if it declares one (hidden from the model). A tool
that raises is recorded as failed, or as ambiguous when it may have acted (a timeout, a connection lost
after sending: ``warden_client.outcome_unknown``); the model then gets what the tool's failure policy
says (function_tool's failure_error_function), or, for an ambiguous call, that it must not retry it.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import threading
from collections import Counter
from datetime import datetime
from typing import Any

from agents.tool import maybe_invoke_function_tool_failure_error_function, set_function_tool_failure_error_function
from agents.tracing import TracingProcessor
from agents.tracing.span_data import FunctionSpanData, GenerationSpanData, ResponseSpanData

from agents import FunctionTool

from ._adapters import (
    DEFAULT_CLASS,
    KEY_ARGUMENT,
    Classifier,
    canonical,
    cost_usd,
    idempotency_key_set,
    model_arguments,
    not_allowed_answer,
    outcome_unknown,
    request_key,
    step_of,
    unknown_answer,
)
from ._models import WardenError
from .client import WardenClient

RESTARTED = "the agent restarted while this call was under way"


def _answer(result: Any) -> str:
    return result if isinstance(result, str) else json.dumps(result, default=str)


def _recordable(result: Any) -> Any:
    try:
        json.dumps(result)
        return result
    except (TypeError, ValueError):
        return str(result)


def _without_key(schema: dict) -> dict:
    """The tool's parameters as the model sees them: Warden's key is the adapter's to give."""
    schema = copy.deepcopy(schema)
    schema.get("properties", {}).pop(KEY_ARGUMENT, None)
    if KEY_ARGUMENT in schema.get("required", []):
        schema["required"] = [name for name in schema["required"] if name != KEY_ARGUMENT]
    return schema


class WardenTools:
    """Wraps function tools so that each call goes through Warden first (see the module's docstring).

    ``classes``: what each tool does, by Warden's name, as (tool_class, reversibility); it counts only
    where it is stricter than what Warden's registry or the project says, and a tool named nowhere is
    treated as a non-idempotent irreversible write (it waits for a reviewer). ``unknown``: which
    exceptions mean the call may have acted (default ``outcome_unknown``)."""

    def __init__(self, client: WardenClient, run_id: int, task: str, *, classes: dict | None = None,
                 wait_seconds: float = 3600, unknown: Classifier = outcome_unknown):  # fmt: skip
        self.client, self.run_id, self.task = client, run_id, task
        self.classes, self.wait_seconds, self.unknown = dict(classes or {}), wait_seconds, unknown
        # How many calls like each one (tool, canonical arguments) this task made, and each call id's step
        # (the SDK may invoke a call again, after its own approval flow).
        self._seen: Counter = Counter()
        self._steps: dict[str, int] = {}
        self._lock = threading.Lock()

    def step(self, warden_name: str, arguments: dict, call_id: str = "") -> int:
        with self._lock:
            if call_id and call_id in self._steps:
                return self._steps[call_id]
            identity = (warden_name, canonical(model_arguments(arguments)))
            self._seen[identity] += 1
            step = step_of(warden_name, arguments, self._seen[identity])
            if call_id:
                self._steps[call_id] = step
            return step

    def wrap(self, tool: FunctionTool, *, name: str | None = None, deduplicates: bool = False) -> FunctionTool:
        """The same tool for the model (name, description, schema), through Warden. ``name``: Warden's
        name for it (e.g. payments.refund), when it differs from the model's. ``deduplicates``: the
        tool's service acts once per idempotency key, so a call cut off by a restart is made again."""
        warden_name = name or tool.name
        tool_class, reversibility = self.classes.get(warden_name, DEFAULT_CLASS)
        takes_key = KEY_ARGUMENT in tool.params_json_schema.get("properties", {})
        # The tool itself, raising instead of answering the model with its failure: the outcome is
        # recorded first, then the model gets what the tool's failure policy says.
        raw = set_function_tool_failure_error_function(copy.copy(tool), None)

        async def invoke(context, arguments_json: str):
            arguments = model_arguments(json.loads(arguments_json or "{}"))
            step = self.step(warden_name, arguments, getattr(context, "tool_call_id", "") or "")
            try:
                op = await asyncio.to_thread(
                    self.client.operation_intent, self.run_id, task=self.task, step=step, tool=warden_name,
                    arguments=arguments, tool_class=tool_class, reversibility=reversibility,
                    idempotency_key=request_key(self.run_id, self.task, step),
                )  # fmt: skip
            except WardenError as exc:
                if exc.status != 403:
                    raise
                return not_allowed_answer(warden_name, exc.message)
            call = _Call(self, tool, raw, warden_name, takes_key, deduplicates)
            return await call.carry_out(op, context, arguments)

        schema = _without_key(tool.params_json_schema)
        return dataclasses.replace(tool, on_invoke_tool=invoke, params_json_schema=schema)


class _Call:
    """One tool call through Warden: its decision, the call with the key, and its outcome."""

    def __init__(self, tools: WardenTools, tool: FunctionTool, raw: FunctionTool, warden_name: str, takes_key: bool,
                 deduplicates: bool):  # fmt: skip
        self.tools, self.client, self.tool, self.raw = tools, tools.client, tool, raw
        self.warden_name, self.takes_key, self.deduplicates = warden_name, takes_key, deduplicates

    async def carry_out(self, op, context, arguments: dict):
        if op.status == "committed":  # made before this agent restarted: its answer, not a second call
            return _answer(op.result)
        if op.status in ("failed", "ambiguous") and not op.created:
            why = op.status_reason or op.status
            return unknown_answer(self.warden_name, why) if op.status == "ambiguous" else f"Error: {why}"
        if op.status == "executing" and not op.created and not self.deduplicates:
            return await self._report_unknown(op, RESTARTED)  # under way when an earlier process died
        if not op.decided:
            op = await asyncio.to_thread(self.client.operation_wait, op.id, timeout=self.tools.wait_seconds)
        if op.status == "approved":
            op = await asyncio.to_thread(self.client.operation_start, op.id)
        if op.status == "committed":
            return _answer(op.result)
        if op.status != "executing":
            why = op.status_reason or ("no reviewer decided in time" if not op.decided else op.status)
            return not_allowed_answer(self.warden_name, why)
        return await self._call(op, context, arguments)

    async def _call(self, op, context, arguments: dict):
        call_arguments = {**arguments, KEY_ARGUMENT: op.idempotency_key} if self.takes_key else arguments
        if self.takes_key and hasattr(context, "_function_tool_arguments"):
            context._function_tool_arguments = None  # prepared for the model's arguments; these add the key
        try:
            with idempotency_key_set(op.idempotency_key):
                result = await self.raw.on_invoke_tool(context, json.dumps(call_arguments))
        except (Exception, asyncio.CancelledError) as exc:
            return await self._failed(op, context, exc)
        await asyncio.to_thread(self.client.operation_outcome, op.id, committed=True, result=_recordable(result))
        return result

    async def _failed(self, op, context, exc: BaseException):
        error = f"{type(exc).__name__}: {exc}"[:1000]
        if isinstance(exc, asyncio.CancelledError) or self.tools.unknown(exc):
            answer = await self._report_unknown(op, error)
            if isinstance(exc, asyncio.CancelledError):
                raise exc
            return answer
        await asyncio.to_thread(self.client.operation_outcome, op.id, committed=False, error=error)
        answer = await maybe_invoke_function_tool_failure_error_function(function_tool=self.tool, context=context,
                                                                         error=exc)  # fmt: skip
        if answer is None:  # the tool's policy: the run fails with the exception
            raise exc
        return answer

    async def _report_unknown(self, op, why: str) -> str:
        await asyncio.to_thread(self.client.operation_outcome, op.id, committed=False, ambiguous=True, error=why)
        return unknown_answer(self.warden_name, why)


def _moment(value: str | None) -> datetime:
    return datetime.fromisoformat(value) if value else datetime.now().astimezone()


class WardenTracing(TracingProcessor):
    """The SDK's model calls (tokens and cost) and tool calls, reported to the Warden run as they end (each
    once). ``prices``: USD per million input and output tokens by model name, for the cost of a model
    call whose provider does not report one (Warden's cost budgets and charts count it)."""

    def __init__(self, client: WardenClient, run_id: int, task: str, *, prices: dict | None = None):
        self.client, self.run_id, self.task, self.prices = client, run_id, task, dict(prices or {})

    def on_span_end(self, span) -> None:
        data = span.span_data
        usage: dict = {}
        if isinstance(data, GenerationSpanData):
            kind, name, usage = "model_call", data.model or "model", data.usage or {}
        elif isinstance(data, ResponseSpanData) and data.response is not None:
            response = data.response
            kind, name = "model_call", getattr(response, "model", "") or "model"
            raw = getattr(response, "usage", None)
            usage = {"input_tokens": getattr(raw, "input_tokens", 0), "output_tokens": getattr(raw, "output_tokens", 0),
                     "cost": getattr(raw, "cost", None)}  # fmt: skip
        elif isinstance(data, FunctionSpanData):
            kind, name = "tool_call", data.name
        else:
            return
        tokens_in, tokens_out = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
        self.client.span_report(
            self.run_id, task=self.task, kind=kind, name=str(name)[:200], started_at=_moment(span.started_at),
            ended_at=_moment(span.ended_at), tokens_in=tokens_in, tokens_out=tokens_out,
            cost_usd=cost_usd(self.prices, str(name), tokens_in, tokens_out, usage.get("cost")),
            status="error" if span.error else "ok",
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
