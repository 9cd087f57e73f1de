"""What the lower layers announce, for whoever listens above them.

The engine, the broker and the approvals say "this run changed" or "this user's access changed" inside
the transaction that changed it, and a circuit breaker says it opened or closed by itself; listeners (the
dashboard's live push, the approvals' paging, the engine's resuming of parked tasks) register once at
start-up and hear after commit, never on rollback. So nothing below them imports them.
"""

import logging
from collections.abc import Callable
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
