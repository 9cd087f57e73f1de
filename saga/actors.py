"""The saga's actor: safe to receive a message twice or out of order (the executor's lease decides)."""

import dramatiq

from runs.actors import TIME_LIMIT_MS

from .compensation import RUN_OPERATIONS
from .executor import run_operations as operations_run


@dramatiq.actor(actor_name=RUN_OPERATIONS, queue_name="warden", max_retries=0, time_limit=TIME_LIMIT_MS)
def run_operations(run_id: int) -> None:
    """The supervisor's executor of a run's proposals and compensations (saga/executor.py)."""
    operations_run(run_id)
