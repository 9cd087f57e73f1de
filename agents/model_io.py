"""What one model call sends and gets back, shared by the gateway (agents/gateway.py) and the real
providers it calls (agents/providers.py), so neither imports the other to name them."""

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings


@dataclass
class ModelRequest:
    agent_slug: str
    instructions: str
    prompt: str
    turn: int  # the model call's number within the task, 1-based; stable across attempts
    attempt: int
    context: dict[str, Any] = field(default_factory=dict)  # values a scripted turn may quote
    tool_names: list[str] = field(default_factory=list)  # the tools the task may call
    cache_seconds: int = 0  # the agent's: how long an identical request may be answered from the cache
    fallback: tuple[str, str] | None = None  # (provider, model) to use while the provider's breaker is open
    routing: dict = field(default_factory=dict)  # the agent's rule for simple steps (a cheaper model)
    project_id: int | None = None  # the run's: its own HTTP and MCP tools are among those it may call
    # Real providers: the task's exchanges so far, provider-neutral (agents/conversation.py), rebuilt
    # from the journal; ``prompt`` is then the task message alone.
    history: list[dict] = field(default_factory=list)
    # The most the model may answer with (0: the deployment's default), asked of the provider and
    # reserved against the budgets before the call.
    max_output_tokens: int = 0
    # The agent's own OpenAI-compatible endpoint (Agent.endpoint): its URL, its key's name and project,
    # and whether it takes max_tokens; empty: the deployment's.
    endpoint: dict = field(default_factory=dict)


@dataclass
class ModelResponse:
    text: str = ""
    tool_call: dict | None = None  # {"name": ..., "arguments": {...}}: the first of tool_calls
    tool_calls: list[dict] | None = None  # every call of the reply: [{"id", "name", "arguments"}]
    final: Any = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_micros: int = 0
    model: str = ""
    retries: int = 0  # tries the gateway made before this answer
    cached: bool = False  # answered from the gateway's cache: no call made, nothing paid
    sent: dict | None = None  # what the model was sent (system and user messages), kept with the answer
    provider: str = ""  # the provider that answered (a routing rule or a fallback may pick another)

    def as_journal(self) -> dict:
        body: dict[str, Any] = {"text": self.text}
        if self.retries:
            body["retries"] = self.retries
        if self.cached:
            body["cached"] = True
        if self.sent is not None:
            body["request"] = self.sent
        if self.tool_call is not None:
            body["tool_call"] = self.tool_call
        if self.tool_calls:
            body["tool_calls"] = self.tool_calls
        if self.final is not None:
            body["final"] = self.final
        if self.provider and self.provider != "scripted":  # the scripted provider is its agent's, always
            body["provider"] = self.provider
        return body


def max_output_tokens(provider: str, request: ModelRequest) -> int:
    if request.max_output_tokens:
        return request.max_output_tokens
    key = "SCRIPTED_MAX_OUTPUT_TOKENS" if provider == "scripted" else "MODEL_MAX_OUTPUT_TOKENS"
    return settings.WARDEN[key]
