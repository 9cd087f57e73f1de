"""The model gateway: one interface for every provider, and the one place where calls to real models
are retried, paused by a breaker and priced.

- The scripted provider plays an agent's scripted turns, so demos and drills need no network; its
  failures are drills of the engine's own retries and pass straight through.
- A real provider (agents/providers.py) is called at most 1 + MODEL_RETRIES times per model step:
  429, 5xx, timeouts and garbled answers are retried after the provider's Retry-After, or a jittered
  exponential backoff, both capped. Only the answer that came back is journaled, so a retried call
  is counted and paid for once.
- A breaker per provider opens after MODEL_CIRCUIT_FAILURES failed tries in a row: while it is open a
  model step fails at once with the ``provider`` class, which hands the run to a human instead of
  burning its budget on retries.
- Cost is the price table (ModelPrice: seeded from the genai-prices package, an admin's price wins;
  agents/prices.py) applied to the tokens the provider reported.
"""

import dataclasses
import hashlib
import json
import logging
import math
import random
import string
import time
from decimal import Decimal

from django.conf import settings
from django.core.cache import cache

from core.cache import tolerant
from core.circuit import Breaker, breaker_reason, rate_wait
from core.errors import StepFailure, TransientFailure

from .model_io import ModelRequest, ModelResponse, max_output_tokens
from .prices import price_get
from .providers import AnthropicProvider, OpenAIProvider, ProviderRetryable

log = logging.getLogger("warden.gateway")

# Scripted models are priced like a small hosted model, so budgets and cost totals mean something.
SCRIPTED_PRICE_MICROS_PER_TOKEN = (1, 4)  # (input, output)


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


def _script_turn(script: list[dict], turn: int, task: str = "") -> dict:
    """The turn a model call plays: turns with ``repeat: N`` stand for N consecutive calls. Entries with
    ``tasks: [keys]`` belong to those tasks only (a planner's re-plan turn, one worker's own turns)."""
    script = [entry for entry in script if not entry.get("tasks") or task in entry["tasks"]]
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
        entry = _script_turn(script, request.turn, request.context.get("task", ""))
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
        # Cut at the output ceiling, as a provider stops at max_tokens.
        response.tokens_out = min(
            max_output_tokens("scripted", request), max(1, len(json.dumps(response.as_journal())) // 4)
        )
        # What the model was given, viewable on the model-call span as for a real provider.
        response.sent = {"system": request.instructions, "user": request.prompt, "tools": list(request.tool_names)}
        response.cost_micros = _price("scripted", model, response.tokens_in, response.tokens_out)
        return response


SCRIPTED = ScriptedProvider()
DEFAULT_INSTRUCTIONS = "You are a careful agent."  # the system message of an agent without instructions


def _real_providers() -> dict:
    return {"openai": OpenAIProvider(), "anthropic": AnthropicProvider()}


def route(provider: str, model: str, request: ModelRequest) -> tuple[str, str]:
    """A simple step (a short prompt, by the agent's rule) goes to the cheaper model the rule names."""
    rule = request.routing or {}
    if not rule:
        return provider, model
    try:
        limit, cheap = int(rule["max_prompt_chars"]), str(rule["model"])
    except (KeyError, TypeError, ValueError):
        needs = "routing needs max_prompt_chars and model"
        raise StepFailure(f"agent {request.agent_slug}: {needs}", "validation") from None
    if len(request.prompt) <= limit:
        return str(rule.get("provider") or provider), cheap
    return provider, model


def worst_case(*, provider: str, model: str, request: ModelRequest) -> tuple[int, int]:
    """The most a call for ``request`` can cost, in tokens and micro-dollars: the whole prompt (its
    characters over PROMPT_CHARS_PER_TOKEN) and the output ceiling, at the dearer of the model the
    request is routed to and its fallback. Reserved against the budgets before the call is made."""
    provider, model = route(provider, model, request)
    sent = len(request.instructions) + len(request.prompt) + sum(len(name) for name in request.tool_names)
    if request.history:
        sent += len(json.dumps(request.history, default=str))
    tokens_in = math.ceil(sent / settings.WARDEN["PROMPT_CHARS_PER_TOKEN"])
    tokens_out = max_output_tokens(provider, request)
    candidates = [(provider, model)] + ([request.fallback] if request.fallback else [])
    cost = max(_price(name, each, tokens_in, tokens_out) for name, each in candidates)
    return tokens_in + tokens_out, cost


def _price(provider: str, model: str, tokens_in: int, tokens_out: int) -> int:
    if provider == "scripted":
        return tokens_in * SCRIPTED_PRICE_MICROS_PER_TOKEN[0] + tokens_out * SCRIPTED_PRICE_MICROS_PER_TOKEN[1]
    return cost_micros(provider, model, tokens_in, tokens_out)


def model_complete(*, provider: str, script: list[dict], model: str, request: ModelRequest) -> ModelResponse:
    provider, model = route(provider, model, request)
    if provider == "scripted":
        return SCRIPTED.complete(script=script, model=model, request=request)
    impl = _real_providers().get(provider)
    if impl is None:
        raise StepFailure(f"unknown model provider {provider!r}", "validation")
    request.instructions = request.instructions or DEFAULT_INSTRUCTIONS
    if request.fallback and request.fallback[0] != provider:
        try:
            return _cached_or_called(impl, model, request)
        except StepFailure as exc:
            if exc.failure_class != "provider":
                raise
            fallback = _real_providers().get(request.fallback[0])
            if fallback is None:
                raise
            log.warning("model %s/%s: %s; falling back to %s/%s", provider, model, exc, *request.fallback)
            return _cached_or_called(fallback, request.fallback[1], request)
    return _cached_or_called(impl, model, request)


def _cached_or_called(impl, model: str, request: ModelRequest) -> ModelResponse:
    if not request.cache_seconds:
        return _call_with_retries(impl, model, request)
    key = _cache_key(impl.name, model, request)
    hit = tolerant(lambda: cache.get(key), None)  # no cache while Redis is away: the call is made
    if hit is not None:
        return ModelResponse(**{**hit, "cached": True, "retries": 0, "cost_micros": 0})
    response = _call_with_retries(impl, model, request)
    tolerant(lambda: cache.set(key, dataclasses.asdict(response), timeout=request.cache_seconds), None)
    return response


def _cache_key(provider: str, model: str, request: ModelRequest) -> str:
    """Identical requests: the same model, messages and tools (the prompt carries the task's own steps)."""
    what = json.dumps(
        [
            provider,
            model,
            request.instructions,
            request.prompt,
            sorted(request.tool_names),
            request.history,
            request.endpoint.get("base_url") or "",
        ],
        sort_keys=True,
        default=str,
    )
    return f"warden:model-cache:{hashlib.sha256(what.encode()).hexdigest()}"


def _call_with_retries(impl, model: str, request: ModelRequest) -> ModelResponse:
    cfg, circuit = settings.WARDEN, circuit_name(impl.name, request)
    for tries in range(1, cfg["MODEL_RETRIES"] + 2):
        wait = BREAKER.admit(circuit)  # half-open: this call may be its probe
        if wait:
            raise StepFailure(breaker_reason(BREAKER.ref(circuit), wait), "provider")
        wait = rate_wait(f"model:{impl.name}", cfg["MODEL_RATE_PER_MINUTE"].get(impl.name))
        if wait > cfg["MODEL_RETRY_CAP_SECONDS"]:
            # Holding the worker that long would starve others: the task retries later, with backoff.
            raise TransientFailure(f"model provider {impl.name} is over its rate limit for {wait:.0f}s")
        if wait:
            time.sleep(wait)
        try:
            response = impl.complete(model=model, request=request)
        except ProviderRetryable as exc:
            _circuit_record(circuit, ok=False)
            if tries > cfg["MODEL_RETRIES"]:
                raise TransientFailure(f"model call failed after {tries} tries: {exc}") from exc
            delay = _retry_delay(tries, exc.retry_after)
            log.info("model %s/%s: %s; try %s in %.2fs", impl.name, model, exc, tries + 1, delay)
            time.sleep(delay)
            continue
        _circuit_record(circuit, ok=True)
        response.retries = tries - 1
        response.provider = impl.name
        # The prompt as sent, viewable on the model-call span. It holds no secret argument: those are
        # sealed apart before anything is journaled, and keys never enter a prompt. The exchanges before
        # it are the journal's own steps: counted here, not copied into every step again.
        response.sent = {"system": request.instructions, "user": request.prompt, "tools": list(request.tool_names)}
        if request.history:
            response.sent["history_turns"] = len(request.history)
        response.cost_micros = cost_micros(impl.name, model, response.tokens_in, response.tokens_out)
        return response
    raise AssertionError("unreachable")


def _retry_delay(tries: int, retry_after: float | None) -> float:
    """The provider's Retry-After when it gave one, else exponential backoff with full jitter; both capped."""
    cfg = settings.WARDEN
    cap = cfg["MODEL_RETRY_CAP_SECONDS"]
    if retry_after is not None:
        return min(cap, retry_after)
    return random.uniform(0, min(cap, cfg["MODEL_RETRY_BASE_SECONDS"] * 2 ** (tries - 1)))


def cost_micros(provider: str, model: str, tokens_in: int, tokens_out: int) -> int:
    """The price table applied to the tokens: USD per million tokens is micro-dollars per token."""
    price = price_get(provider, model)
    if price is None:
        log.warning("no price for %s/%s: its calls cost nothing in budgets until one is set", provider, model)
        return 0
    total = Decimal(tokens_in) * price.input_usd_per_mtok + Decimal(tokens_out) * price.output_usd_per_mtok
    return int(total.to_integral_value())


# --- the breaker, per provider ------------------------------------------------------------------------------

# The deployment's, one per provider: every project's agents share the provider and its account.
BREAKER = Breaker(what="provider", prefix="warden:model-circuit", failures_setting="MODEL_CIRCUIT_FAILURES",
                  open_setting="MODEL_CIRCUIT_OPEN_SECONDS")  # fmt: skip
circuit_open_for, _circuit_record = BREAKER.open_for, BREAKER.record


def circuit_name(provider: str, request: ModelRequest) -> str:
    """An agent's own endpoint has its own breaker, named by the agent (its address stays out of the
    reasons people read): one server down does not stop the agents of another."""
    if provider == "openai" and request.endpoint.get("base_url"):
        return f"{provider}:{request.agent_slug}"
    return provider


def circuit_reset(provider: str | None = None) -> None:
    BREAKER.reset([provider] if provider else ["openai", "anthropic"])
    if provider is None:
        BREAKER.reset_all()
