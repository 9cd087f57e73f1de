"""Real model providers behind the gateway. Each turns a ModelRequest into one call of its SDK and the
answer into a ModelResponse; the gateway (agents/gateway.py) retries, limits and prices around it.

Errors are mapped to two kinds: ``ProviderRetryable`` (429, 5xx, timeouts, a garbled answer — worth
another try, after ``retry_after`` seconds if the provider said so) and StepFailure for what another
try would not fix (a 400, a refused key).
"""

import json
import os
from contextlib import contextmanager

from django.conf import settings

from core.errors import StepFailure
from tools.catalog import tool_spec
from tools.memory import TOOL_SCHEMAS
from tools.secrets import SecretRefused, scrub_failure, secrets_for

from .conversation import anthropic_messages, openai_messages
from .model_io import ModelRequest, ModelResponse, max_output_tokens

MAX_CALLS_PER_REPLY = 16  # tool calls taken from one reply; more is a runaway, not a plan


class ProviderRetryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


def _retry_after(headers) -> float | None:
    """Seconds from a Retry-After header (only the delta-seconds form; a date is rare from model APIs)."""
    value = (headers or {}).get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


# OpenAI function names allow [a-zA-Z0-9_-]; Warden's tools are named system.action.
def _function_name(tool: str) -> str:
    return tool.replace(".", "__")


def _tool_name(function: str) -> str:
    return function.replace("__", ".")


def tool_functions(tool_names: list[str], project_id: int | None = None) -> list[dict]:
    """The tools an agent may call, as function declarations from their arguments' JSON Schemas."""

    functions = []
    for name in tool_names:
        if name in TOOL_SCHEMAS:  # Warden's own memory tools
            description, arguments = TOOL_SCHEMAS[name]
            parameters = arguments.model_json_schema()
        elif (spec := tool_spec(name, project_id)) is not None and not spec.internal:
            description, parameters = (spec.description or name)[:1000], spec.arguments_schema()
        else:
            continue
        function = {"name": _function_name(name), "description": description, "parameters": parameters}
        functions.append({"type": "function", "function": function})
    return functions


def _sdk_settings(provider: str) -> dict:
    """Client settings every SDK takes alike; the key is read from the environment at each call."""
    variable = settings.WARDEN[f"{provider.upper()}_API_KEY_ENV"]
    key = os.environ.get(variable, "")
    if not key:
        raise StepFailure(f"no API key for the {provider} provider (${variable} is not set)", "validation")
    return {
        "api_key": key,
        "base_url": settings.WARDEN[f"{provider.upper()}_BASE_URL"],
        "max_retries": 0,  # the gateway retries, once, for every provider
        "timeout": settings.WARDEN["MODEL_TIMEOUT_SECONDS"],
    }


# Sent to an agent's own endpoint that names no key (a local server without auth): the SDK needs one,
# and the deployment's key goes only to the deployment's endpoint.
NO_KEY = "no-key"


def endpoint_key_problems(endpoint: dict, *, project_id: int | None) -> list[str]:
    """Why ``project_id``'s run (or, at save, the agent's project) may not use the endpoint's key."""
    name = endpoint.get("api_key_secret")
    if not name:
        return []
    if endpoint.get("project_id") is None:
        return [f"the key {name} must belong to a project: choose the agent's project"]
    if project_id != endpoint["project_id"]:
        return [f"the key {name} is the agent's project's: a run of another project may not use it"]
    try:
        secrets_for([name], project_id=project_id)
    except SecretRefused as exc:
        return [str(exc)]
    return []


def _openai_settings(request: ModelRequest) -> tuple[dict, str | None]:
    """The SDK's settings for the agent's endpoint (or the deployment's), and the key it was given when
    it is a project's secret (scrubbed from what the endpoint answers)."""
    endpoint = request.endpoint or {}
    if not endpoint.get("base_url") and not endpoint.get("api_key_secret"):
        return _sdk_settings("openai"), None
    sdk = {
        "base_url": endpoint.get("base_url") or settings.WARDEN["OPENAI_BASE_URL"],
        "max_retries": 0,
        "timeout": settings.WARDEN["MODEL_TIMEOUT_SECONDS"],
    }
    name = endpoint.get("api_key_secret")
    if not name:
        return {**sdk, "api_key": NO_KEY}, None
    if problems := endpoint_key_problems(endpoint, project_id=request.project_id):
        raise StepFailure(f"agent {request.agent_slug}: {problems[0]}", "validation")
    key = secrets_for([name], project_id=request.project_id)[name]  # read now: a rotated key is used at once
    return {**sdk, "api_key": key}, key


def _sends_max_tokens(endpoint: dict) -> bool:
    """The agent's endpoint says so; the deployment's endpoint, its setting."""
    if endpoint.get("send_max_tokens"):
        return True
    return not endpoint.get("base_url") and bool(settings.WARDEN.get("OPENAI_SEND_MAX_TOKENS"))


@contextmanager
def _sdk_errors(sdk):
    """The official SDKs share their error types: map them to the gateway's two kinds (5xx includes
    Anthropic's 529, overloaded)."""
    try:
        yield
    except sdk.RateLimitError as exc:
        raise ProviderRetryable("429 rate limited", _retry_after(exc.response.headers)) from exc
    except sdk.APIStatusError as exc:
        code = exc.status_code
        if code >= 500 or code in (408, 409):
            raise ProviderRetryable(f"{code} from the provider", _retry_after(exc.response.headers)) from exc
        raise StepFailure(f"the provider refused the call ({code}): {exc.message[:300]}", "permanent") from exc
    except (sdk.APITimeoutError, sdk.APIConnectionError) as exc:
        raise ProviderRetryable(f"no answer: {exc.__class__.__name__}") from exc
    except (sdk.APIResponseValidationError, json.JSONDecodeError, ValueError) as exc:
        raise ProviderRetryable(f"an answer that is not the protocol's JSON: {exc!r}"[:300]) from exc


class OpenAIProvider:
    """Any OpenAI-compatible chat-completions endpoint, through the official SDK."""

    name = "openai"

    def complete(self, *, model: str, request: ModelRequest) -> ModelResponse:
        import openai

        # max_completion_tokens is OpenAI's current name; servers that only know the older one refuse it.
        limit = "max_tokens" if _sends_max_tokens(request.endpoint or {}) else "max_completion_tokens"
        body = {
            "model": model,
            "messages": openai_messages(request.instructions, request.prompt, request.history),
            limit: max_output_tokens(self.name, request),
        }
        functions = tool_functions(request.tool_names, request.project_id)
        if functions:
            body["tools"] = functions
        sdk, key = _openai_settings(request)
        client = openai.OpenAI(**sdk)
        try:
            with _sdk_errors(openai):
                completion = client.chat.completions.create(**body)
        except (StepFailure, ProviderRetryable) as exc:
            if key:  # an endpoint may quote the key it refused: not into the task's reason
                scrub_failure(exc, [key])
            raise
        return _openai_response(completion, model)


class AnthropicProvider:
    """Anthropic's messages API through the official SDK."""

    name = "anthropic"

    def complete(self, *, model: str, request: ModelRequest) -> ModelResponse:
        import anthropic

        body = {
            "model": model,
            "max_tokens": max_output_tokens(self.name, request),
            "system": request.instructions,
            "messages": anthropic_messages(request.prompt, request.history),
        }
        tools = [
            {"name": f["function"]["name"], "description": f["function"]["description"],
             "input_schema": f["function"]["parameters"]}
            for f in tool_functions(request.tool_names, request.project_id)
        ]  # fmt: skip
        if tools:
            body["tools"] = tools
        client = anthropic.Anthropic(**_sdk_settings(self.name))
        with _sdk_errors(anthropic):
            message = client.messages.create(**body)
        return _anthropic_response(message, model)


def _anthropic_response(message, model: str) -> ModelResponse:
    blocks = getattr(message, "content", None)
    if not isinstance(blocks, list):
        raise ProviderRetryable("an answer without content")
    usage = getattr(message, "usage", None)
    text = "".join(getattr(b, "text", "") for b in blocks if getattr(b, "type", "") == "text")
    response = ModelResponse(
        model=getattr(message, "model", None) or model,
        text=text,
        tokens_in=int(getattr(usage, "input_tokens", 0) or 0),
        tokens_out=int(getattr(usage, "output_tokens", 0) or 0),
    )
    uses = [b for b in blocks if getattr(b, "type", "") == "tool_use"]
    if uses:
        response.tool_calls = [
            {"id": str(getattr(u, "id", "") or "")[:100], "name": _tool_name(u.name), "arguments": u.input}
            for u in uses[:MAX_CALLS_PER_REPLY]
        ]
        response.tool_call = response.tool_calls[0]
        return response
    try:
        response.final = json.loads(text)
    except json.JSONDecodeError:
        response.final = text
    return response


def _openai_call(call) -> dict:
    function = call.function
    try:
        arguments = json.loads(function.arguments or "{}")
    except json.JSONDecodeError:
        # Kept as text: the broker answers the model with a structured error, and the loop guard counts it.
        arguments = function.arguments[:4000]
    return {"id": str(getattr(call, "id", "") or "")[:100], "name": _tool_name(function.name), "arguments": arguments}


def _openai_response(completion, model: str) -> ModelResponse:
    try:
        message = completion.choices[0].message
    except (AttributeError, IndexError, TypeError) as exc:
        raise ProviderRetryable("an answer without a choice") from exc
    usage = getattr(completion, "usage", None)
    response = ModelResponse(
        model=getattr(completion, "model", None) or model,
        text=message.content or "",
        tokens_in=int(getattr(usage, "prompt_tokens", 0) or 0),
        tokens_out=int(getattr(usage, "completion_tokens", 0) or 0),
    )
    calls = message.tool_calls or []
    if calls:
        response.tool_calls = [_openai_call(call) for call in calls[:MAX_CALLS_PER_REPLY]]
        response.tool_call = response.tool_calls[0]
        return response
    # No tool call: the final answer, JSON when the model wrote JSON (the task's output schema decides).
    try:
        response.final = json.loads(response.text)
    except json.JSONDecodeError:
        response.final = response.text
    return response
