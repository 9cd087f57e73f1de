"""Dramatiq actors of the integrations: ids only, safe to receive twice (runs/actors.py says why)."""

import dramatiq

from runs.actors import TIME_LIMIT_MS

from .webhooks import DELIVER, webhook_deliver


@dramatiq.actor(actor_name=DELIVER, queue_name="warden", max_retries=0, time_limit=TIME_LIMIT_MS)
def deliver_webhook(delivery_id: int) -> None:
    webhook_deliver(delivery_id=delivery_id)
