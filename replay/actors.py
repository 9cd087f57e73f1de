"""The replay app's actor: a shadowed run's twin starts here (replay/shadows.py), not in the production run's
start, which it must not slow."""

import dramatiq

from runs.actors import TIME_LIMIT_MS

from .shadows import SHADOW_START, shadow_twin_start


@dramatiq.actor(actor_name=SHADOW_START, queue_name="warden", max_retries=0, time_limit=TIME_LIMIT_MS)
def shadow_start(run_id: int) -> None:
    shadow_twin_start(run_id=run_id)
