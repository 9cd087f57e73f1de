"""Dramatiq middleware the settings name (DRAMATIQ_BROKER): fault drills can have every message delivered
twice. The broker is built before the models load, so a middleware that needs the engine (the recovery
sweeper's, runs/services/recovery.py) is added by runs/apps.py instead."""

import random

from dramatiq.message import generate_unique_id
from dramatiq.middleware import Middleware


class DuplicateDelivery(Middleware):
    """Fault drills only (WARDEN_CHAOS_DUPLICATE_DELIVERY=1, chaos/drills.py): each message sent is sent
    again, up to a second later, as a broker that redelivers would. The copy is marked, so it is not
    copied again. Actors must not care (runs/actors.py)."""

    def after_enqueue(self, broker, message, delay):
        if message.options.get("chaos_copy"):
            return
        # A new id: the Redis broker keeps a message's body under its id, so a copy under the same id
        # would be the same delivery, not a second one.
        copy = message.copy(message_id=generate_unique_id(), options={**message.options, "chaos_copy": True})
        broker.enqueue(copy, delay=(delay or 0) + random.randint(0, 1000))
