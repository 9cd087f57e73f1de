"""Dramatiq middleware: every worker process also runs the recovery sweeper; fault drills can have every
message delivered twice."""

import random
import time

from dramatiq.message import generate_unique_id
from dramatiq.middleware import Middleware

from core import metrics


class RecoverySweeperMiddleware(Middleware):
    """Every worker process runs the sweeper, registers itself (runs/workers.py) and counts its messages:
    the hop (enqueued until picked up) and the outcome, by actor (core/metrics.py)."""

    def after_worker_boot(self, broker, worker):
        from .services.recovery import sweeper

        sweeper.start(threads=worker.worker_threads)

    def before_worker_shutdown(self, broker, worker):
        from .services.recovery import sweeper

        sweeper.stop()
        metrics.process_exited()

    def before_process_message(self, broker, message):
        # From when it was due: a delayed message (a retry's backoff) waits on purpose until its eta.
        due = max(message.message_timestamp, message.options.get("eta") or 0) / 1000
        waited = time.time() - due
        metrics.HOP_SECONDS.labels(metrics.bounded(message.actor_name)).observe(max(0.0, waited))

    def after_process_message(self, broker, message, *, result=None, exception=None):
        outcome = "ok" if exception is None else "error"
        metrics.MESSAGES.labels(metrics.bounded(message.actor_name), outcome).inc()

    after_skip_message = after_process_message


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
