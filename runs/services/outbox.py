"""Messages leave through outbox rows written in the deciding transaction.

After commit the row is sent and deleted (the fast path); a row that a crash left behind is re-sent by
the recovery sweeper. Actors are safe to receive a message twice, so re-sending is always allowed.
"""

import logging

import dramatiq
from django.db import transaction

from core import bus, sql

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
    if sent:
        # One statement in autocommit (the ORM's delete wraps itself in a transaction: three round trips).
        where, params = sql.in_list("id", sent)
        sql.execute(f"DELETE FROM runs_outbox WHERE {where}", params)
    return len(sent)
