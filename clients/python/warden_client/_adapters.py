"""What the framework adapters share (warden_client.openai_agents, warden_client.langgraph): a tool call's
step in Warden's ledger by what the call is, the idempotency key handed to the wrapped tool, whether a
tool that raised may have acted anyway, and what a model call cost."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

KEY_ARGUMENT = "idempotency_key"  # the keyword a wrapped tool declares to receive Warden's key
DEFAULT_CLASS = ("non_idempotent_write", "irreversible")  # an unknown tool is the most dangerous kind
MAX_STEP = 2_000_000_000  # the ledger's step is a positive 32-bit integer

_current_key: ContextVar[str | None] = ContextVar("warden_idempotency_key", default=None)


def current_idempotency_key() -> str | None:
    """Warden's idempotency key of the tool call under way, inside a tool an adapter wrapped (None
    elsewhere). Pass it to the service the tool calls: a call made again after a restart carries the same
    key, so a service that deduplicates by it acts once."""
    return _current_key.get()


@contextlib.contextmanager
def idempotency_key_set(key: str) -> Iterator[None]:
    token = _current_key.set(key)
    try:
        yield
    finally:
        _current_key.reset(token)


def canonical(arguments: Any) -> str:
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def model_arguments(arguments: Mapping) -> dict:
    """The call's arguments as the model gave them: Warden's key is not one of them."""
    return {name: value for name, value in arguments.items() if name != KEY_ARGUMENT}


def step_of(tool: str, arguments: Mapping, occurrence: int = 1) -> int:
    """A tool call's step in the task's ledger, from what the call is: Warden's name of the tool, its
    canonical arguments, and how many calls just like it the task made before (``occurrence``, from 1).
    Not the call's order (parallel calls come back in any order) nor the model's tool-call id (a model
    asked again answers with a fresh one): an agent restarted that asks for the same call finds its
    operation, and the operation's answer."""
    identity = f"{tool}\n{canonical(model_arguments(arguments))}\n{occurrence}"
    return 1 + int(hashlib.sha256(identity.encode()).hexdigest()[:15], 16) % MAX_STEP


def request_key(run_id: int, task: str, step: int) -> str:
    """An intent request's own Idempotency-Key: its retries after a lost answer replay the first answer,
    and any other request (a node run again, a restarted agent) reads the operation as it is now."""
    return f"{uuid.uuid4().hex}:{run_id}:{task}:{step}"


# Exceptions after which the service may have acted: the request left (or may have) and no answer came.
# Named rather than imported so that requests, urllib3 and openai need not be installed.
_MAY_HAVE_ACTED = {
    "httpx.TimeoutException",
    "httpx.NetworkError",
    "httpx.RemoteProtocolError",
    "requests.exceptions.Timeout",
    "requests.exceptions.ConnectionError",
    "urllib3.exceptions.ProtocolError",
    "urllib3.exceptions.ReadTimeoutError",
    "openai.APITimeoutError",
    "openai.APIConnectionError",
}
# ... except these, which fail before anything is sent.
_NOT_SENT = {"httpx.ConnectError", "httpx.ConnectTimeout", "requests.exceptions.ConnectTimeout"}


def _names(error: BaseException) -> set[str]:
    names = set()
    for cls in type(error).__mro__:
        module = cls.__module__
        names.add(f"{module}.{cls.__qualname__}")
        names.add(f"{module.split('.')[0]}.{cls.__qualname__}")  # httpx._exceptions.X is httpx.X
    return names


def outcome_unknown(error: BaseException) -> bool:
    """Whether a tool call that raised ``error`` may have acted all the same (a timeout, a connection
    lost after the request was sent): Warden records it as ambiguous, for a person to check, rather than
    failed. The cause chain counts: a tool's own exception raised from a timeout is a timeout."""
    chain: list[BaseException] = []
    while error is not None and all(error is not seen for seen in chain):
        chain.append(error)
        error = error.__cause__ or error.__context__
    if any(_names(e) & _NOT_SENT or isinstance(e, ConnectionRefusedError) for e in chain):
        return False  # refused or never connected: nothing left (openai's connection error wraps these)
    return any(
        _names(e) & _MAY_HAVE_ACTED or isinstance(e, TimeoutError | ConnectionError | http.client.IncompleteRead)
        for e in chain
    )


def cost_usd(prices: Mapping[str, tuple[float, float]] | None, model: str, tokens_in: int, tokens_out: int,
             reported: Any = None) -> float:  # fmt: skip
    """A model call's cost: what the provider reported with its usage, else from ``prices`` (USD per
    million input and output tokens, by model name), else 0."""
    if isinstance(reported, int | float) and reported >= 0:
        return float(reported)
    price = (prices or {}).get(model)
    if not price:
        return 0.0
    return (tokens_in * price[0] + tokens_out * price[1]) / 1_000_000


def unknown_answer(tool: str, why: str) -> str:
    return f"{tool} may or may not have been done ({why}); a person will check in Warden. Do not retry it."


def not_allowed_answer(tool: str, why: str) -> str:
    return f"Warden did not allow {tool}: {why}. Nothing was done."


Classifier = Callable[[BaseException], bool]
