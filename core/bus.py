"""What the lower layers announce, for whoever listens above them.

The engine, the broker and the approvals say "this run changed" or "this user's access changed" inside
the transaction that changed it; listeners (the dashboard's live push) register once at start-up and hear
after commit, never on rollback. So nothing below the dashboard imports it.
"""

from collections.abc import Callable

from django.db import transaction

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
