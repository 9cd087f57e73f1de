"""Warden for LangGraph (``pip install "./clients/python[langgraph]"``).

``WardenGate.tool_node(tools)`` is a drop-in for LangGraph's ToolNode: each tool call of the model's last
message goes through Warden's gate, ledger and approvals. A call that waits for a reviewer becomes a
LangGraph interrupt (the graph pauses with the operation in ``__interrupt__``); ``resume_when_decided``
waits for the decision and resumes the graph, which re-runs the node: calls already made answer from
Warden's ledger, the decided one is made (approved) or answered as not done (rejected). ``WardenCallbacks``
reports the graph's steps (its nodes), model calls with their tokens, and tool calls to the run's trace.

    gate = WardenGate(warden, run.id, "billing", classes={"payments.refund": ("non_idempotent_write", "irreversible")})
    graph = builder.add_node("tools", gate.tool_node([refund], names={"refund": "payments.refund"})) ... .compile(
        checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "T-4711"}, "callbacks": [WardenCallbacks(warden, run.id, "billing")]}
    result = gate.run(graph, {"messages": [("user", "Refund ch_1001")]}, config)

A step of Warden's ledger is derived from the model's tool call id, so a node re-run after an interrupt,
or an agent restarted that is asked for the same call, finds the call's operation and its answer: a
committed effect is never made twice; one under way when the agent died is marked ambiguous.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import ToolMessage
from langgraph.types import Command, interrupt

from .client import WardenClient

DEFAULT_CLASS = ("non_idempotent_write", "irreversible")


def step_of(call_id: str) -> int:
    """A ledger step for a tool call id: the same call, the same step (and the same operation)."""
    return 1 + int(hashlib.sha256(call_id.encode()).hexdigest()[:8], 16) % 2_000_000_000


def _text(result: Any) -> str:
    return result if isinstance(result, str) else json.dumps(result, default=str)


class WardenGate:
    def __init__(self, client: WardenClient, run_id: int, task: str, *, classes: dict | None = None,
                 wait_seconds: float = 3600):  # fmt: skip
        self.client, self.run_id, self.task = client, run_id, task
        self.classes, self.wait_seconds = dict(classes or {}), wait_seconds
        self._nonce = uuid.uuid4().hex  # this process's requests (see warden_client.openai_agents)
        # Answers of the calls this process made: a node re-run after an interrupt repeats the calls before
        # the one that waited, and those answer from here (the intent's own answer may be a replay).
        self._answers: dict[int, str] = {}

    def tool_node(self, tools: list, *, names: dict[str, str] | None = None):
        """A graph node that carries out the last message's tool calls through Warden. ``names``: Warden's
        name for a tool, where it differs from the model's."""
        by_name = {t.name: t for t in tools}
        names = names or {}

        def node(state: dict, config) -> dict:
            message = state["messages"][-1]
            answers = []
            for call in getattr(message, "tool_calls", None) or []:
                tool = by_name.get(call["name"])
                if tool is None:
                    content = f"there is no tool named {call['name']!r}"
                else:
                    content = self._call(tool, names.get(call["name"], call["name"]), call, config)
                answers.append(ToolMessage(content=content, tool_call_id=call["id"], name=call["name"]))
            return {"messages": answers}

        return node

    def _call(self, tool, warden_name: str, call: dict, config) -> str:
        tool_class, reversibility = self.classes.get(warden_name, DEFAULT_CLASS)
        step = step_of(call["id"])
        if step in self._answers:
            return self._answers[step]
        op = self.client.operation_intent(
            self.run_id, task=self.task, step=step, tool=warden_name, arguments=call["args"], tool_class=tool_class,
            reversibility=reversibility, idempotency_key=f"{self._nonce}:{self.run_id}:{self.task}:{step}",
        )  # fmt: skip
        answer = self._carry_out(op, tool, warden_name, call, config)
        self._answers[step] = answer
        return answer

    def _carry_out(self, op, tool, warden_name: str, call: dict, config) -> str:
        if op.status == "committed":
            return _text(op.result)
        if op.status == "executing" and not op.created:
            self.client.operation_outcome(op.id, committed=False, ambiguous=True,
                                          error="the agent restarted while this call was under way")  # fmt: skip
            return (
                f"{warden_name} may or may not have been done before a restart; a person will check. Do not retry it."
            )
        if not op.decided:
            interrupt({"warden_operation": op.id, "tool": warden_name, "arguments": call["args"]})
            op = self.client.operation_get(op.id)  # resumed: the decision is in
        if op.status == "approved":
            op = self.client.operation_start(op.id)
        if op.status != "executing":
            return f"Warden did not allow {warden_name}: {op.status_reason or op.status}. Nothing was done."
        try:
            result = tool.invoke(call["args"], config=config)
        except Exception as exc:
            self.client.operation_outcome(op.id, committed=False, error=str(exc)[:1000])
            raise
        recorded = result if isinstance(result, str | dict | list) else str(result)
        self.client.operation_outcome(op.id, committed=True, result=recorded)
        return _text(result)

    def pending(self, graph, config: dict) -> list[int]:
        """The Warden operations the graph is paused on."""
        state = graph.get_state(config)
        return [i.value["warden_operation"] for i in state.interrupts if isinstance(i.value, dict)
                and "warden_operation" in i.value]  # fmt: skip

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


class WardenCallbacks(BaseCallbackHandler):
    """The graph's nodes, its model calls (with their tokens) and tool calls, reported to the Warden run."""

    def __init__(self, client: WardenClient, run_id: int, task: str):
        self.client, self.run_id, self.task = client, run_id, task
        self._started: dict = {}

    def _start(self, run_id, **_) -> None:
        self._started[run_id] = time.time()

    on_chain_start = on_chat_model_start = on_llm_start = on_tool_start = _start

    def _report(self, run_id, kind: str, name: str, tokens_in: int = 0, tokens_out: int = 0, error: bool = False):
        started = datetime.fromtimestamp(self._started.pop(run_id, time.time()), tz=UTC)
        self.client.span_report(
            self.run_id, task=self.task, kind=kind, name=name[:200], started_at=started, ended_at=datetime.now(UTC),
            tokens_in=tokens_in, tokens_out=tokens_out, status="error" if error else "ok",
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
        self._report(run_id, "model_call", str(model), usage.get("input_tokens", 0), usage.get("output_tokens", 0))

    def on_tool_end(self, output, *, run_id, name=None, **kwargs) -> None:
        self._report(run_id, "tool_call", name or "tool")


__all__ = ["WardenCallbacks", "WardenGate", "step_of"]
