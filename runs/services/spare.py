"""Spare time: a shadow's work (replay/shadows.py) runs only while no live work waits for a worker, so a
shadow never slows the runs it follows. Asked at a twin's start and at each of its attempts."""

import random

from core import sql

# A ready task of a running live run: live work a worker has not taken yet (the (status, ready_at) index).
_LIVE_WORK_WAITING = (
    "SELECT 1 FROM runs_task t JOIN runs_run r ON r.id = t.run_id "
    "WHERE t.status = 'ready' AND r.status = 'running' AND r.mode = 'live' LIMIT 1"
)
PUT_OFF_MAX_SECONDS = 30.0


def live_work_waiting() -> bool:
    return sql.fetchone(_LIVE_WORK_WAITING, []) is not None


def put_off_seconds(times: int = 0) -> float:
    """How long shadow work is put off the ``times``-th time: from about half a second, growing, jittered
    (so what was put off together does not come back together)."""
    return min(PUT_OFF_MAX_SECONDS, 0.5 * 1.5**times) * random.uniform(0.75, 1.25)
