"""Spare time: a shadow's work (replay/shadows.py) runs only while no live work is going (ready for a worker
or being done by one), so a shadow never slows the runs it follows: a worker thread that is free does not
mean a free core (the threads of a process share one interpreter, the processes of a machine its cores).
Asked at a twin's start, at each of its attempts and before each of its model calls."""

import random

from core import sql

# A ready or running task of a running live run (the (status, ready_at) and (status, lease_expires_at)
# indexes): live work going.
_LIVE_WORK_GOING = (
    "SELECT 1 FROM runs_task t JOIN runs_run r ON r.id = t.run_id "
    "WHERE t.status IN ('ready', 'running') AND r.status IN ('running', 'cancelling') AND r.mode = 'live' LIMIT 1"
)
PUT_OFF_MAX_SECONDS = 30.0


def live_work_going() -> bool:
    return sql.fetchone(_LIVE_WORK_GOING, []) is not None


def put_off_seconds(times: int = 0) -> float:
    """How long shadow work is put off the ``times``-th time: from about a second, doubling, jittered (so
    what was put off together does not come back together); each look costs the workers a message."""
    return min(PUT_OFF_MAX_SECONDS, 2.0**times) * random.uniform(0.75, 1.25)
