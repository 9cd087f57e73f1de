"""Messages leave through outbox rows written in the deciding transaction.

After commit the row is sent (the fast path) and forgotten: the rows the broker has are deleted in
batches by one thread of the process, so a message costs its sender no statement or commit of its own
after the send (a run's start is one transaction). A row that a crash left behind, sent or not, is
re-sent by the recovery sweeper after OUTBOX_RESEND_AFTER_SECONDS. Actors are safe to receive a message
twice, so re-sending is always allowed.
"""

import logging
import os
import time

import dramatiq
from django.db import close_old_connections, connection, transaction

from core import bus, sql
from core.worker_thread import WorkerThread

from ..models import Outbox

log = logging.getLogger("warden.outbox")


def outbox_add(*, actor: str, kwargs: dict, delay_ms: int = 0) -> Outbox:
    """Call inside the transaction whose commit decides that the message must leave."""
    row = Outbox.objects.create(actor=actor, kwargs=kwargs, delay_ms=delay_ms)
    if "run_id" in kwargs:
        bus.run_changed(kwargs["run_id"])
    transaction.on_commit(lambda: outbox_deliver(rows=[row]))
    return row


def outbox_deliver(*, rows) -> int:
    """Send rows to the broker, then forget them. A failed send leaves the row for the sweeper."""
    broker = dramatiq.get_broker()
    sent = []
    for row in rows:
        try:
            broker.get_actor(row.actor).send_with_options(kwargs=row.kwargs, delay=row.delay_ms or None)
        except Exception:  # the broker is down: the row stays, the sweeper tries again
            log.warning("outbox: could not send %s %s; will retry", row.actor, row.kwargs, exc_info=True)
            continue
        sent.append(row.id)
    if sent and connection.in_atomic_block:
        # Delivered inside a transaction (a test running the commit's callbacks in its own): deleted in it.
        _delete(sent)
    elif sent:
        forgetter.add(sent)
    return len(sent)


def _delete(ids: list[int]) -> None:
    # One statement (the ORM's delete wraps itself in a transaction: three round trips).
    where, params = sql.in_list("id", ids)
    sql.execute(f"DELETE FROM runs_outbox WHERE {where}", params)


class Forgetter(WorkerThread):
    """One daemon thread per process deletes the rows the broker has, a batch at a time (a batch is what
    came in while the last one was deleted, and at least BATCH_WAIT_SECONDS' worth). A process that dies
    with rows in hand leaves them to the sweeper, which sends them again: a duplicate message, harmless."""

    BATCH_WAIT_SECONDS = 0.02

    name = "warden-outbox"

    def __init__(self):
        super().__init__()
        self._ids: list[int] = []

    def add(self, ids: list[int]) -> None:
        with self._cv:
            self._ids += ids
            self._wake()

    def _has_work(self) -> bool:
        return bool(self._ids)

    def _run(self) -> None:
        while True:
            with self._cv:
                if not self._await_work():
                    return
            time.sleep(self.BATCH_WAIT_SECONDS)  # what the other threads send meanwhile joins this batch
            with self._cv:
                ids, self._ids, self._busy = self._ids, [], True
            try:
                close_old_connections()
                _delete(ids)
            except Exception:  # the rows stay: the sweeper sends them again, and the actors take that
                log.warning("outbox: could not forget %d sent rows; the sweeper will send them again", len(ids),
                            exc_info=True)  # fmt: skip
            finally:
                self._done()

    def after_fork(self) -> None:
        self.__init__()  # the parent deletes what it had in hand; the child starts with nothing


forgetter = Forgetter()
os.register_at_fork(after_in_child=forgetter.after_fork)
