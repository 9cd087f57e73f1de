"""The replay app's actors: a shadowed run's twin starts here (replay/shadows.py), not in the production run's
start, which it must not slow, and only when the workers have spare time; a suite's replay run is graded by
its case's judges here (a model call, never inside the transaction that ended the run)."""

import time

import dramatiq

from runs.actors import TIME_LIMIT_MS
from runs.services.spare import live_work_going, put_off_seconds

from .services import GRADE_PAIR, replay_pair_grade
from .shadows import SHADOW_START, START_WITHIN_SECONDS, shadow_twin_skip, shadow_twin_start


@dramatiq.actor(actor_name=SHADOW_START, queue_name="warden", max_retries=0, time_limit=TIME_LIMIT_MS, priority=100)
def shadow_start(run_id: int, times: int = 0, since: float | None = None) -> None:
    """Lower priority than the engine's messages (a worker holding both takes theirs first); put off while
    live work is going."""
    since = since if since is not None else time.time()
    if live_work_going():
        if time.time() - since > START_WITHIN_SECONDS:
            return shadow_twin_skip(run_id=run_id)
        wait = put_off_seconds(times)
        shadow_start.send_with_options(kwargs={"run_id": run_id, "times": times + 1, "since": since},
                                       delay=int(wait * 1000))  # fmt: skip
        return None
    shadow_twin_start(run_id=run_id)
    return None


@dramatiq.actor(actor_name=GRADE_PAIR, queue_name="warden", max_retries=0, time_limit=TIME_LIMIT_MS)
def grade_replay_pair(pair_id: int) -> None:
    """A suite's replay run ended: its case's judges grade it (a model call each)."""
    replay_pair_grade(pair_id)
