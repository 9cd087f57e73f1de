"""Warden for LangGraph (``pip install "./clients/python[langgraph]"``).

``WardenGate.tool_node(tools)`` is a drop-in for LangGraph's ToolNode: each tool call of the model's last
message goes through Warden's gate, ledger and approvals. Calls that wait for a reviewer become one
LangGraph interrupt (the graph pauses with the operations in ``__interrupt__``); ``resume_when_decided``
waits for the decisions and resumes the graph, which re-runs the node: calls already made answer from
Warden's ledger, the decided ones are made (approved) or answered as not done (rejected).
``WardenCallbacks`` reports the graph's steps (its nodes), model calls with their tokens and cost, and tool
calls to the run's trace.

    gate = WardenGate(warden, run.id, "billing", classes={"payments.refund": ("non_idempotent_write", "irreversible")})
    graph = builder.add_node("tools", gate.tool_node([refund], names={"refund": "payments.refund"})) ... .compile(
        checkpointer=SqliteSaver(sqlite3.connect("checkpoints.sqlite", check_same_thread=False)))
    config = {"configurable": {"thread_id": "T-4711"}, "callbacks": [WardenCallbacks(warden, run.id, "billing")]}
    result = gate.run(graph, {"messages": [("user", "Refund ch_1001")]}, config)

A call's step in Warden's ledger is what the call is: Warden's name of the tool, its canonical arguments,
and how many calls just like it the conversation held before (counted in the graph's messages), never the
model's tool-call id. A node re-run after an interrupt or a restart, and a model asked again after a
restart that lost its checkpoint (it answers with fresh ids), find the call's operation and its answer: a
committed effect is never made twice. A call under way when the agent died is made again with the same key
if its tool's service deduplicates by it (``tool_node(..., deduplicates={"refund"})``), otherwise marked
ambiguous (a person checks) and not made again.

The wrapped tool receives Warden's idempotency key: ``warden_client.current_idempotency_key()`` while it
runs, and as the argument ``idempotency_key`` if it declares one (``Annotated[str, InjectedToolArg]``
keeps it out of the model's schema). A tool that raises, or whose ``handle_tool_error`` answered, is
recorded as failed (ambiguous when it may have acted: a timeout, a connection lost after sending), and the
model gets the error as the tool's answer (``handle_errors=False``: the exception ends the node).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import ToolMessage
from langgraph.types import Command, interrupt

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


def _text(result: Any) -> str:
    return result if isinstance(result, str) else json.dumps(result, default=str)


def _recorded(content: Any) -> Any:
    """What the tool answered, for the ledger: its JSON as data where it is JSON."""
    if isinstance(content, str):
        try:
            return json.loads(content)
        except ValueError:
            return content
    return content if isinstance(content, dict | list) else str(content)


def _takes_key(tool) -> bool:
    schema = tool.get_input_schema()
    fields = getattr(schema, "model_fields", None)
    return KEY_ARGUMENT in (fields if fields is not None else schema.get("properties", {}))


class WardenGate:
    """The tool node's link to Warden (see the module's docstring). ``unknown``: which exceptions mean
    the call may have acted (default ``outcome_unknown``)."""

    def __init__(self, client: WardenClient, run_id: int, task: str, *, classes: dict | None = None,
                 wait_seconds: float = 3600, unknown: Classifier = outcome_unknown):  # fmt: skip
        self.client, self.run_id, self.task = client, run_id, task
        self.classes, self.wait_seconds, self.unknown = dict(classes or {}), wait_seconds, unknown

    def tool_node(self, tools: list, *, names: dict[str, str] | None = None, deduplicates: Collection[str] = (),
                  handle_errors: bool = True):  # fmt: skip
        """A graph node that carries out the last message's tool calls through Warden. ``names``: Warden's
        name for a tool, where it differs from the model's. ``deduplicates``: the tools (the model's names)
        whose service acts once per idempotency key, made again with the same key after a restart."""
        by_name = {t.name: t for t in tools}
        names, deduplicates = names or {}, set(deduplicates)

        def warden_name(call: dict) -> str:
            return names.get(call["name"], call["name"])

        def identity(call: dict) -> tuple[str, str]:
            return warden_name(call), canonical(model_arguments(call["args"]))

        def node(state: dict, config) -> dict:
            messages = state["messages"]
            # Calls just like one of these that the conversation made before: its occurrence, from the
            # graph's own state, so a resumed or restarted node counts as the first run did.
            seen = Counter(identity(c) for m in messages[:-1] for c in getattr(m, "tool_calls", None) or [])
            answers, waiting = [], []
            for call in getattr(messages[-1], "tool_calls", None) or []:
                tool, name = by_name.get(call["name"]), warden_name(call)
                seen[identity(call)] += 1
                if tool is None:
                    answers.append(ToolMessage(f"there is no tool named {call['name']!r}", tool_call_id=call["id"],
                                               name=call["name"], status="error"))  # fmt: skip
                    continue
                step = step_of(name, call["args"], seen[identity(call)])
                call_ = _Call(self, tool, name, call, call["name"] in deduplicates, handle_errors)
                answer = call_.decided(step, config)
                if answer is None:
                    waiting.append(call_)
                answers.append(call_ if answer is None else answer)
            if waiting:  # the calls that need no reviewer are made; a re-run finds them in the ledger
                interrupt({"warden_operations": [c.op.id for c in waiting]})
                for call_ in waiting:  # resumed: the decisions are in
                    call_.op = self.client.operation_get(call_.op.id)
            return {"messages": [a if isinstance(a, ToolMessage) else a.carry_out(config) for a in answers]}

        return node

    def pending(self, graph, config: dict) -> list[int]:
        """The Warden operations the graph is paused on."""
        state = graph.get_state(config)
        values = [i.value for i in state.interrupts if isinstance(i.value, dict)]
        return [op for value in values for op in value.get("warden_operations", [])]

    def resume_when_decided(self, graph, config: dict):
        """Wait for the decisions the graph is paused on, then resume it; until it is paused on none."""
        result = None
        while waiting := self.pending(graph, config):
            for operation_id in waiting:
                self.client.operation_wait(operation_id, timeout=self.wait_seconds)
            result = graph.invoke(Command(resume="decided"), config)
        return result

    def run(self, graph, inputs: dict, config: dict):
        """Invoke the graph, and resume it after each decision it waits for; the final state."""
        result = graph.invoke(inputs, config)
        return self.resume_when_decided(graph, config) or result


class _Call:
    """One tool call through Warden: its intent and decision, the call with the key, its outcome."""

    def __init__(self, gate: WardenGate, tool, warden_name: str, call: dict, deduplicates: bool, handle_errors: bool):
        self.gate, self.client, self.tool, self.warden_name, self.call = gate, gate.client, tool, warden_name, call
        self.deduplicates, self.handle_errors, self.op = deduplicates, handle_errors, None

    def answer(self, content: Any, status: str = "success") -> ToolMessage:
        return ToolMessage(content=_text(content), tool_call_id=self.call["id"], name=self.call["name"], status=status)

    def decided(self, step: int, config) -> ToolMessage | None:
        """The call's answer, made now if it may be; None while it waits for a reviewer."""
        tool_class, reversibility = self.gate.classes.get(self.warden_name, DEFAULT_CLASS)
        arguments = model_arguments(self.call["args"])
        try:
            op = self.client.operation_intent(
                self.gate.run_id, task=self.gate.task, step=step, tool=self.warden_name, arguments=arguments,
                tool_class=tool_class, reversibility=reversibility,
                idempotency_key=request_key(self.gate.run_id, self.gate.task, step),
            )  # fmt: skip
        except WardenError as exc:
            if exc.status != 403:
                raise
            return self.answer(not_allowed_answer(self.warden_name, exc.message), "error")
        self.op = op
        if op.status == "committed":  # made before: its recorded answer, not a second call
            return self.answer(op.result)
        if op.status in ("failed", "ambiguous") and not op.created:
            why = op.status_reason or op.status
            return self.answer(unknown_answer(self.warden_name, why) if op.status == "ambiguous" else why, "error")
        if op.status == "executing" and not op.created and not self.deduplicates:
            return self._unknown(op, RESTARTED)  # under way when an earlier process of the agent died
        return None if not op.decided else self.carry_out(config)

    def carry_out(self, config) -> ToolMessage:
        """The call, now that it is decided."""
        op = self.op
        if not op.decided:
            return self.answer(not_allowed_answer(self.warden_name, "no reviewer decided"), "error")
        if op.status == "approved":
            op = self.client.operation_start(op.id)
        if op.status == "committed":
            return self.answer(op.result)
        if op.status != "executing":
            return self.answer(not_allowed_answer(self.warden_name, op.status_reason or op.status), "error")
        return self._make(op, config)

    def _make(self, op, config) -> ToolMessage:
        arguments = dict(self.call["args"])
        if _takes_key(self.tool):
            arguments[KEY_ARGUMENT] = op.idempotency_key
        tool_call = {"type": "tool_call", "id": self.call["id"], "name": self.call["name"], "args": arguments}
        try:
            with idempotency_key_set(op.idempotency_key):
                message = self.tool.invoke(tool_call, config=config)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:1000]
            if self.gate.unknown(exc):
                return self._unknown(op, error)
            self.client.operation_outcome(op.id, committed=False, error=error)
            if not self.handle_errors:
                raise
            return self.answer(f"Error: {error}\n Please fix your mistakes.", "error")
        content = message.content if isinstance(message, ToolMessage) else message
        if isinstance(message, ToolMessage) and message.status == "error":  # the tool's handle_tool_error answered
            self.client.operation_outcome(op.id, committed=False, error=_text(content)[:1000])
            return self.answer(content, "error")
        self.client.operation_outcome(op.id, committed=True, result=_recorded(content))
        return self.answer(content)

    def _unknown(self, op, why: str) -> ToolMessage:
        self.client.operation_outcome(op.id, committed=False, ambiguous=True, error=why)
        return self.answer(unknown_answer(self.warden_name, why), "error")


class WardenCallbacks(BaseCallbackHandler):
    """The graph's nodes, its model calls (with their tokens and cost) and tool calls, reported to the Warden
    run. ``prices``: USD per million input and output tokens by model name, for the cost of a model call
    whose provider does not report one (Warden's cost budgets and charts count it)."""

    def __init__(self, client: WardenClient, run_id: int, task: str, *, prices: dict | None = None):
        self.client, self.run_id, self.task, self.prices = client, run_id, task, dict(prices or {})
        self._started: dict = {}

    def _start(self, *_, run_id, **__) -> None:
        self._started[run_id] = time.time()

    on_chain_start = on_chat_model_start = on_llm_start = on_tool_start = _start

    def _report(self, run_id, kind: str, name: str, tokens_in: int = 0, tokens_out: int = 0, error: bool = False,
                cost: float = 0.0):  # fmt: skip
        started = datetime.fromtimestamp(self._started.pop(run_id, time.time()), tz=UTC)
        self.client.span_report(
            self.run_id, task=self.task, kind=kind, name=name[:200], started_at=started, ended_at=datetime.now(UTC),
            tokens_in=tokens_in, tokens_out=tokens_out, cost_usd=cost, status="error" if error else "ok",
            idempotency_key=f"langgraph-span:{self.run_id}:{run_id}",
        )  # fmt: skip

    def on_chain_end(self, outputs, *, run_id, metadata=None, tags=None, name=None, **kwargs) -> None:
        node = (metadata or {}).get("langgraph_node")
        if node and node == name:  # a node of the graph (not a chain inside one)
            self._report(run_id, "plan", f"node {node}")
        else:
            self._started.pop(run_id, None)

    def on_llm_end(self, response, *, run_id, **kwargs) -> None:
        message = response.generations[0][0].message if response.generations and response.generations[0] else None
        usage = getattr(message, "usage_metadata", None) or {}
        model = (response.llm_output or {}).get("model_name") or getattr(message, "response_metadata", {}).get(
            "model_name", "model")  # fmt: skip
        tokens_in, tokens_out = usage.get("input_tokens", 0), usage.get("output_tokens", 0)
        reported = (getattr(message, "response_metadata", {}).get("token_usage") or {}).get("cost")
        cost = cost_usd(self.prices, str(model), tokens_in, tokens_out, reported)
        self._report(run_id, "model_call", str(model), tokens_in, tokens_out, cost=cost)

    def on_tool_end(self, output, *, run_id, name=None, **kwargs) -> None:
        status = getattr(output, "status", "success")  # a ToolMessage the tool's error handler wrote
        self._report(run_id, "tool_call", name or "tool", error=status == "error")

    def on_tool_error(self, error, *, run_id, name=None, **kwargs) -> None:
        self._report(run_id, "tool_call", name or "tool", error=True)


__all__ = ["WardenCallbacks", "WardenGate", "step_of"]
