"""The fault drills (chaos/drills.py) at CI size: each drill really kills workers, stops Redis, restarts
PostgreSQL, duplicates every message or loses answers, and every run must settle with nothing done twice.
They restart the services this test session uses, so they run last (tests/conftest.py)."""

import json
import os
import subprocess
import sys

import pytest
from django.db import connections

from tests.conftest import ROOT

pytestmark = [pytest.mark.services, pytest.mark.processes, pytest.mark.chaos]
RUNS = int(os.environ.get("WARDEN_CHAOS_RUNS", 4))


# A drill whose runs do not settle reports it after --settle-timeout; the test waits for that report (its
# reasons and the drills' progress are the diagnosis) rather than being cut off by the default timeout.
@pytest.mark.timeout(1000)
def test_every_drill_settles_every_run_with_no_effect_twice_and_nothing_lost(tmp_path):
    env = dict(os.environ, WARDEN_VAR_DIR=str(tmp_path))
    for name in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "WARDEN_QUEUE_NAMESPACE"):
        env.pop(name, None)  # the drills set up their own
    command = [sys.executable, "chaos/drills.py", "--runs", str(RUNS), "--redis-down", "10", "--json"]
    try:
        done = subprocess.run(
            [*command, "--settle-timeout", "150"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
        )
    except subprocess.TimeoutExpired as exc:
        connections.close_all()
        progress = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        pytest.fail(f"the drills did not finish in 900 s; their progress:\n{progress[-4000:]}")
    connections.close_all()  # PostgreSQL was restarted under this session's connections
    assert done.stdout.strip(), done.stderr[-4000:]
    print(done.stderr[-4000:])  # the drills' progress, shown when an assertion below fails
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    print(done.stdout)
    assert [row["drill"] for row in rows] == [
        "worker-sigkill", "redis-down", "postgres-restart", "duplicates-and-freeze", "timeouts-after-commit",
    ]  # fmt: skip
    for row in rows:
        assert row["runs"] == RUNS, row
        assert row["converged"] == RUNS, row
        assert (row["duplicates"], row["orphans"], row["lost"], row["unreconciled"]) == (0, 0, 0, 0), row
        assert row["effects"] > 0, row
    by_drill = {row["drill"]: row for row in rows}
    # Nothing but the timeouts needs a person: the runs that lost a worker, Redis or PostgreSQL completed.
    for drill in ("worker-sigkill", "redis-down", "postgres-restart", "duplicates-and-freeze"):
        assert by_drill[drill]["completed"] == RUNS, by_drill[drill]
    timeouts = by_drill["timeouts-after-commit"]
    assert timeouts["completed"] == RUNS // 2 + RUNS % 2 and timeouts["needs_attention"] == RUNS // 2
    assert all("a human must check" in reason for reason in timeouts["reasons"]), timeouts["reasons"]
    assert done.returncode == 0, done.stderr[-4000:]
