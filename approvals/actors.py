"""The reviewers' notifications leave from a worker, never from a commit hook or the sweeper's pass (a
mail server that hangs must not hold up a worker's step or the recovery of runs). Ids only; safe to
receive twice: a notification is claimed before it is sent."""

import dramatiq

from runs.actors import TIME_LIMIT_MS

from .breaker_pages import BREAKER_NOTIFY, breaker_notifications_send
from .notify import NOTIFY, notifications_send


@dramatiq.actor(actor_name=NOTIFY, queue_name="warden", max_retries=0, time_limit=TIME_LIMIT_MS)
def send_notifications(ids: list[int] | None = None) -> None:
    notifications_send(ids)


@dramatiq.actor(actor_name=BREAKER_NOTIFY, queue_name="warden", max_retries=0, time_limit=TIME_LIMIT_MS)
def send_breaker_notifications(ids: list[int] | None = None) -> None:
    """Pages about an opened circuit breaker (approvals/breaker_pages.py)."""
    breaker_notifications_send(ids)
