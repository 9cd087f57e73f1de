"""A worker process dies in the middle of a task that has already changed the outside world (B4)."""

import pytest

from runs.models import Run, Span, Task
from runs.services import run_start
from tests.conftest import wait_for
from tools.models import SandboxCall

SHORT_LEASE = {"WARDEN_LEASE_SECONDS": 2, "WARDEN_HEARTBEAT_SECONDS": 0.5}


@pytest.mark.services
@pytest.mark.processes
def test_a_fresh_worker_resumes_after_a_crash_between_two_side_effects(demo_tx, processes):
    run = run_start(workflow="incident-fanout", input={"faults": [{"task": "worker-3", "call": 3, "mode": "crash"}]})
    # One thread, so the crash cannot catch another task between a call and its journal entry.
    first = processes.worker(threads=1, **SHORT_LEASE)
    wait_for(lambda: first.poll() is not None, timeout=60, message="the worker to die at worker-3's third call")
    w3 = Task.objects.get(run=run, key="worker-3")
    assert w3.status == Task.Status.RUNNING  # its lease is now an orphan
    assert SandboxCall.objects.filter(idempotency_key__contains=":worker-3:", is_effect=True).count() == 1

    processes.worker(threads=2, **SHORT_LEASE)
    wait_for(lambda: Run.objects.get(id=run.id).is_terminal, timeout=90, message="the run to finish")
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED, run.status_reason
    effects = list(SandboxCall.objects.filter(is_effect=True).values_list("tool", "idempotency_key"))
    assert len(effects) == len(set(effects)) == 15  # 5 tickets, 5 updates, 5 e-mails: no duplicate
    w3.refresh_from_db()
    assert w3.recoveries == 1 and w3.attempts == 2
    # the resumed attempt replayed calls 1 and 2 from the journal and called out from call 3 on
    second = Span.objects.filter(task=w3, attempt=2, kind="tool_call").order_by("step")
    assert [s.name for s in second] == ["crm.update", "email.send"]
    assert Span.objects.filter(run=run, kind="recovery", task=w3).exists()


@pytest.mark.services
@pytest.mark.processes
def test_workers_reconnect_after_their_database_connections_are_killed(demo_tx, processes):
    from django.db import connection

    processes.worker(threads=2)
    first = run_start(workflow="deploy-review")
    wait_for(lambda: Run.objects.get(id=first.id).is_terminal, timeout=30, message="a first run")
    with connection.cursor() as cursor:  # what a PostgreSQL restart does to every open connection
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
    second = run_start(workflow="deploy-review")
    wait_for(lambda: Run.objects.get(id=second.id).is_terminal, timeout=30, message="a run after the reconnect")
    assert Run.objects.get(id=second.id).status == Run.Status.COMPLETED


@pytest.mark.services
@pytest.mark.processes
def test_many_runs_across_several_workers_converge_without_duplicate_effects(demo_tx, processes):
    runs = [run_start(workflow="incident-fanout") for _ in range(8)] + [
        run_start(workflow="deploy-review") for _ in range(4)
    ]
    processes.worker(threads=4)
    processes.worker(threads=4)
    wait_for(lambda: all(Run.objects.get(id=r.id).is_terminal for r in runs), timeout=120, message="all runs")
    assert set(Run.objects.values_list("status", flat=True)) == {Run.Status.COMPLETED}
    effects = list(SandboxCall.objects.filter(is_effect=True).values_list("tool", "idempotency_key"))
    assert len(effects) == len(set(effects)) == 8 * 15
    assert SandboxCall.objects.filter(system="deployments").count() == 4
    # every task ran exactly one attempt, except risk's scripted retry
    assert set(Task.objects.filter(run__in=runs).exclude(key="risk").values_list("attempts", flat=True)) == {1}
