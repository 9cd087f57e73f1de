"""The supervisor's executor of proposals and compensations. Ids only; safe to receive twice."""

import dramatiq

from runs.actors import TIME_LIMIT_MS

from .saga import run_operations as _run_operations


@dramatiq.actor(actor_name="run_operations", queue_name="warden", max_retries=0, time_limit=TIME_LIMIT_MS)
def run_operations(run_id: int) -> None:
    _run_operations(run_id)
