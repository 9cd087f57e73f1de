"""Dramatiq actors. They receive ids only and are safe to receive a message twice or out of order:
the database decides what, if anything, is left to do. Retries belong to the engine, not Dramatiq."""

import dramatiq
from django.conf import settings

from .services.execution import task_execute

# Below the lease: a worker cannot outlive its lease unnoticed by Dramatiq either.
TIME_LIMIT_MS = int(settings.WARDEN["LEASE_SECONDS"] * 900)


@dramatiq.actor(actor_name="execute_task", queue_name="warden", max_retries=0, time_limit=TIME_LIMIT_MS)
def execute_task(run_id: int, task_id: int) -> None:
    task_execute(run_id=run_id, task_id=task_id)
