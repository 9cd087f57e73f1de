"""The model gateway: one interface for every provider. This release ships the scripted provider,
which plays an agent's scripted turns so demos and tests need no network."""

import json
import string
import time
from dataclasses import dataclass, field
from typing import Any

from runs.errors import StepFailure, TransientFailure

# Scripted models are priced like a small hosted model, so budgets and cost totals mean something.
SCRIPTED_PRICE_MICROS_PER_TOKEN = (1, 4)  # (input, output)


@dataclass
class ModelRequest:
    agent_slug: str
    instructions: str
    prompt: str
    turn: int  # the model call's number within the task, 1-based; stable across attempts
    attempt: int
    context: dict[str, Any] = field(default_factory=dict)  # values a scripted turn may quote


@dataclass
class ModelResponse:
    text: str = ""
    tool_call: dict | None = None  # {"name": ..., "arguments": {...}}
    final: Any = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_micros: int = 0
    model: str = ""

    def as_journal(self) -> dict:
        body: dict[str, Any] = {"text": self.text}
        if self.tool_call is not None:
            body["tool_call"] = self.tool_call
        if self.final is not None:
            body["final"] = self.final
        return body


class _QuoteFormatter(string.Formatter):
    """str.format over plain dicts and lists only: a script can quote a value, never reach an attribute."""

    def get_field(self, field_name, args, kwargs):
        if "." in field_name:
            raise StepFailure(f"script template {{{field_name}}}: attribute access is not allowed", "validation")
        return super().get_field(field_name, args, kwargs)


_formatter = _QuoteFormatter()


def _render(value, context):
    if isinstance(value, str):
        try:
            return _formatter.vformat(value, (), context)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise StepFailure(f"script template {value!r} cannot be filled: {exc!r}", "validation") from exc
    if isinstance(value, list):
        return [_render(v, context) for v in value]
    if isinstance(value, dict):
        return {k: _render(v, context) for k, v in value.items()}
    return value


def _script_turn(script: list[dict], turn: int) -> dict:
    """The turn a model call plays: turns with ``repeat: N`` stand for N consecutive calls."""
    position = 0
    for entry in script:
        position += int(entry.get("repeat", 1))
        if turn <= position:
            return entry
    if not script:
        raise StepFailure("the scripted agent has no script", "validation")
    return script[-1]


class ScriptedProvider:
    """Turn ``n`` of the task answers with entry ``n`` of the agent's script (see docs/agents.md)."""

    def complete(self, *, script: list[dict], model: str, request: ModelRequest) -> ModelResponse:
        entry = _script_turn(script, request.turn)
        if entry.get("delay"):
            time.sleep(float(entry["delay"]))
        if entry.get("fail") and request.attempt in entry.get("on_attempts", [request.attempt]):
            message = entry.get("message", "scripted failure")
            if entry["fail"] == "transient":
                raise TransientFailure(f"model call failed: {message}")
            raise StepFailure(f"model call failed: {message}", "permanent")
        context = dict(request.context, turn=request.turn, attempt=request.attempt)
        response = ModelResponse(model=model, text=_render(entry.get("say", ""), context))
        if "tool" in entry:
            response.tool_call = {"name": entry["tool"], "arguments": _render(entry.get("arguments", {}), context)}
        elif "final" in entry:
            response.final = _render(entry["final"], context)
        elif "raw" in entry:  # model output that is not valid JSON, for validation drills
            response.final = entry["raw"]
        response.tokens_in = max(1, len(request.prompt) // 4)
        response.tokens_out = max(1, len(json.dumps(response.as_journal())) // 4)
        response.cost_micros = (
            response.tokens_in * SCRIPTED_PRICE_MICROS_PER_TOKEN[0]
            + response.tokens_out * SCRIPTED_PRICE_MICROS_PER_TOKEN[1]
        )
        return response


PROVIDERS = {"scripted": ScriptedProvider()}


def model_complete(*, provider: str, script: list[dict], model: str, request: ModelRequest) -> ModelResponse:
    try:
        impl = PROVIDERS[provider]
    except KeyError:
        raise StepFailure(f"unknown model provider {provider!r}", "validation") from None
    return impl.complete(script=script, model=model, request=request)
