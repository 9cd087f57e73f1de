"""What the lower layers announce, for whoever listens above them.

The engine, the broker and the approvals say "this run changed" or "this user's access changed" inside
the transaction that changed it, and a circuit breaker says it opened or closed by itself; listeners (the
dashboard's live push, the approvals' paging, the engine's resuming of parked tasks) register once at
start-up and hear after commit, never on rollback. So nothing below them imports them.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db import transaction

if TYPE_CHECKING:
    from core.circuit import BreakerRef

log = logging.getLogger("warden.bus")

_run_listeners: list[Callable[[int], None]] = []
_access_listeners: list[Callable[[int], None]] = []


def on_run_changed(listener: Callable[[int], None]) -> None:
    """Register ``listener(run_id)``, called after each commit that changed the run (once per run)."""
    if listener not in _run_listeners:
        _run_listeners.append(listener)


def on_access_changed(listener: Callable[[int], None]) -> None:
    """Register ``listener(user_id)``, called after a commit that changed the user's memberships."""
    if listener not in _access_listeners:
        _access_listeners.append(listener)


def _tell_run(run_id: int) -> None:
    for listener in _run_listeners:
        listener(run_id)


def run_changed(run_id: int) -> None:
    """Call in the transaction that changed the run: listeners learn after commit, never on rollback.

    Registered once per run and transaction. Django replaces its list of commit hooks on commit and
    on every rollback, so the list's identity tells whether our earlier registration is still alive.
    """
    conn = transaction.get_connection()
    if not conn.in_atomic_block:
        _tell_run(run_id)
        return
    hooks = conn.run_on_commit
    state = getattr(conn, "_warden_changed", None)
    if state is None or state[0] is not hooks:
        state = conn._warden_changed = (hooks, set())
    if run_id in state[1]:
        return
    state[1].add(run_id)
    transaction.on_commit(lambda: _tell_run(run_id))


def access_changed(user_id: int) -> None:
    """A membership of this user changed: listeners learn after commit."""

    def tell():
        for listener in _access_listeners:
            listener(user_id)

    transaction.on_commit(tell)


# --- circuit breakers (core/circuit.py) ---------------------------------------------------------------
# Said by the breaker itself, in whatever process saw the call; a listener's failure never reaches the
# call that opened or closed it (paging and resuming have sweepers of their own to catch up).
_breaker_opened_listeners: list[Callable[["BreakerRef", float], None]] = []
_breaker_closed_listeners: list[Callable[["BreakerRef"], None]] = []


def on_breaker_opened(listener: Callable[["BreakerRef", float], None]) -> None:
    """Register ``listener(breaker, opened_at)``: a breaker went from closed to open (once per opening)."""
    if listener not in _breaker_opened_listeners:
        _breaker_opened_listeners.append(listener)


def on_breaker_closed(listener: Callable[["BreakerRef"], None]) -> None:
    """Register ``listener(breaker)``: an open or half-open breaker closed by itself (a call succeeded)."""
    if listener not in _breaker_closed_listeners:
        _breaker_closed_listeners.append(listener)


def _tell_each(listeners: list, *args) -> None:
    for listener in listeners:
        try:
            listener(*args)
        except Exception:
            log.exception("a listener of %s failed", args[0])


def breaker_opened(breaker: "BreakerRef", *, opened_at: float) -> None:
    """Listeners learn after commit (at once outside a transaction), never on rollback."""
    transaction.on_commit(lambda: _tell_each(_breaker_opened_listeners, breaker, opened_at))


def breaker_closed(breaker: "BreakerRef") -> None:
    """Listeners learn after commit (at once outside a transaction), never on rollback."""
    transaction.on_commit(lambda: _tell_each(_breaker_closed_listeners, breaker))


# --- what happened, typed: the engine's, the broker's and the rule-makers' announcements ----------------
# The engine (runs) and the rules below it announce facts; the satellites above (saga, evaluations,
# integrations) subscribe in their AppConfig.ready. An announcement is made inside the transaction that
# decided it. A subscriber either writes rows that must commit with the fact (durable=True: webhook
# deliveries, evaluation rows; an outbox, so nothing is lost between a commit and a crash) or acts after
# commit (the default), never on rollback. docs/architecture.md lists who listens to what.


@dataclass(frozen=True)
class RunSettled:
    """A run reached a terminal status, or needs a person (``status`` says which)."""

    run_id: int
    project_id: int
    status: str
    reason: str
    replay: bool = False  # a what-if run (replay/): nothing outside hears of it


@dataclass(frozen=True)
class RunStarted:
    """A live run of a shadowed workflow was started (run_start: not a fork, a replay or a shadow)."""

    run_id: int
    project_id: int
    workflow_id: int


@dataclass(frozen=True)
class TaskParked:
    """A task stopped to wait (for a reviewer, an answer or a closed breaker); ``reason`` says for what."""

    run_id: int
    task_id: int
    reason: str


@dataclass(frozen=True)
class OperationAmbiguous:
    """A tool call's outcome is unknown (it may have happened): the project's people must look."""

    project_id: int | None
    data: dict


@dataclass(frozen=True)
class VersionCreated:
    """A new immutable version of an agent or a workflow (``kind``: "agent" or "workflow")."""

    kind: str
    version_id: int


@dataclass(frozen=True)
class PolicyChanged:
    """An approval policy was created or changed."""

    policy_id: int


Event = RunSettled | RunStarted | TaskParked | OperationAmbiguous | VersionCreated | PolicyChanged
_subscribers: dict[type, list[tuple[Callable, bool]]] = {}


def subscribe(event_type: type, listener: Callable, *, durable: bool = False) -> None:
    """Register ``listener(event)`` for one event type (at start-up). ``durable``: called at once, inside
    the announcing transaction, so its rows commit or roll back with the fact; otherwise after commit."""
    entries = _subscribers.setdefault(event_type, [])
    if all(existing is not listener for existing, _ in entries):
        entries.append((listener, durable))


def announce(event: Event) -> None:
    """Call inside the transaction that decided ``event`` (at once outside one)."""
    later = []
    for listener, durable in _subscribers.get(type(event), ()):
        if durable:
            listener(event)  # its failure fails the transaction: the fact and its rows go together
        else:
            later.append(listener)
    if later:
        transaction.on_commit(lambda: _tell_each(later, event))
