"""Dramatiq actors. They receive ids only and are safe to receive a message twice or out of order:
the database decides what, if anything, is left to do. Retries belong to the engine, not Dramatiq."""

import dramatiq
from django.conf import settings

from .services.breakers import RESUME, breaker_resume_after_close
from .services.execution import task_execute

# Below the lease, so Dramatiq interrupts a stuck attempt before another worker may take it over.
# (It cannot interrupt blocking I/O: fencing is what makes a late worker harmless.)
TIME_LIMIT_MS = int(1000 * (settings.WARDEN["ACTOR_TIME_LIMIT_SECONDS"] or settings.WARDEN["LEASE_SECONDS"] * 0.9))


@dramatiq.actor(actor_name="execute_task", queue_name="warden", max_retries=0, time_limit=TIME_LIMIT_MS)
def execute_task(run_id: int, task_id: int) -> None:
    task_execute(run_id=run_id, task_id=task_id)


@dramatiq.actor(actor_name=RESUME, queue_name="warden", max_retries=0, time_limit=TIME_LIMIT_MS)
def resume_parked_tasks(what: str, name: str, project_id: int | None) -> None:
    """A breaker closed by itself: the tasks it parked are retried (runs/services/breakers.py)."""
    breaker_resume_after_close(what=what, name=name, project_id=project_id)
