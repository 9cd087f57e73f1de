"""Messages leave only after commit; what a crash left behind is re-sent; dead leases are taken back."""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from runs.models import Outbox, Run, Span, Task
from runs.services import run_start, sweep_once
from runs.services.leases import task_reserve
from runs.services.outbox import forgetter
from runs.services.recovery import expire_leases, resend_outbox


def run_at_once(n: int, work) -> list:
    """Run ``work`` in n threads released together (each with its own database connection)."""
    barrier, results = threading.Barrier(n), []

    def worker():
        barrier.wait()
        try:
            results.append(work())
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.fixture
def sent(monkeypatch):
    messages = []
    monkeypatch.setattr("dramatiq.Actor.send_with_options", lambda self, **kw: messages.append(kw["kwargs"]))
    monkeypatch.setattr("dramatiq.Actor.send", lambda self, **kw: messages.append(kw))
    return messages


def test_a_message_leaves_only_after_commit(demo, sent, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        with transaction.atomic():
            run = run_start(workflow="deploy-review")
            assert Outbox.objects.count() == 2
        assert sent == []  # committed, but the callbacks have not run yet
    for callback in callbacks:
        callback()
    ready = set(run.tasks.filter(status="ready").values_list("id", flat=True))
    assert {m["task_id"] for m in sent} == ready
    assert not Outbox.objects.exists()  # delivered rows are forgotten


def test_a_rolled_back_transaction_sends_nothing(demo, sent, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        with pytest.raises(RuntimeError), transaction.atomic():
            run_start(workflow="deploy-review")
            raise RuntimeError("the request failed after starting the run")
    assert sent == [] and not Run.objects.exists() and not Outbox.objects.exists()


def test_outbox_rows_a_crash_left_are_resent_by_the_sweeper(demo, sent, monkeypatch):
    monkeypatch.setattr("runs.services.outbox.outbox_deliver", lambda rows: 0)  # the process died after commit
    run = run_start(workflow="deploy-review")
    monkeypatch.undo()
    monkeypatch.setattr("dramatiq.Actor.send_with_options", lambda self, **kw: sent.append(kw["kwargs"]))
    assert sweep_once()["outbox_resent"] == 0  # still young: the fast path may yet deliver it
    Outbox.objects.update(created_at=timezone.now() - timedelta(seconds=30))
    assert sweep_once()["outbox_resent"] == 2
    assert sorted(m["task_id"] for m in sent) == sorted(run.tasks.filter(status="ready").values_list("id", flat=True))
    assert not Outbox.objects.exists()


def test_a_dead_workers_lease_is_expired_fenced_and_redriven(demo, sent, django_capture_on_commit_callbacks):
    run = run_start(workflow="deploy-review")
    task = run.tasks.get(key="inventory")
    lease = task_reserve(run_id=run.id, task_id=task.id, owner="host:1:1")
    Task.objects.filter(id=task.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert sweep_once()["leases_expired"] == 1
    task.refresh_from_db()
    assert task.status == Task.Status.READY and task.fencing_token > lease.token and task.recoveries == 1
    recovery = Span.objects.get(run=run, kind="recovery")
    assert recovery.attributes["previous_owner"] == "host:1:1"
    assert {"run_id": run.id, "task_id": task.id} in sent
    # a second pass finds nothing to do
    assert sweep_once()["leases_expired"] == 0


def test_a_task_that_keeps_killing_its_worker_goes_to_a_human(demo, sent, settings):
    run = run_start(workflow="deploy-review")
    task = run.tasks.get(key="inventory")
    for _ in range(settings.WARDEN["MAX_RECOVERIES"] + 1):
        assert task_reserve(run_id=run.id, task_id=task.id, owner="host:1:1") is not None
        Task.objects.filter(id=task.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        expire_leases(timezone.now())
    task.refresh_from_db()
    run.refresh_from_db()
    assert task.status == Task.Status.FAILED and task.failure_class == "crash"
    assert run.status == Run.Status.NEEDS_ATTENTION and "worker was lost" in run.status_reason


@pytest.mark.services
def test_concurrent_sweepers_expire_a_lease_once(demo_tx, sent):
    run = run_start(workflow="deploy-review")
    task = run.tasks.get(key="inventory")
    task_reserve(run_id=run.id, task_id=task.id, owner="host:1:1")
    Task.objects.filter(id=task.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    results = run_at_once(4, lambda: expire_leases(timezone.now()))
    assert sum(results) == 1
    assert Span.objects.filter(run=run, kind="recovery").count() == 1
    assert Task.objects.get(id=task.id).recoveries == 1


def test_the_heartbeat_renews_only_leases_still_held(demo):
    from runs.heartbeat import LeaseKeeper

    run = run_start(workflow="deploy-review")
    inventory, risk = run.tasks.get(key="inventory"), run.tasks.get(key="risk")
    held = task_reserve(run_id=run.id, task_id=inventory.id, owner="me")
    lost = task_reserve(run_id=run.id, task_id=risk.id, owner="me")
    Task.objects.filter(id=risk.id).update(fencing_token=lost.token + 1)  # taken over meanwhile
    before = timezone.now()
    LeaseKeeper.beat([(inventory.id, held.token), (risk.id, lost.token)])
    assert Task.objects.get(id=inventory.id).heartbeat_at >= before
    assert Task.objects.get(id=risk.id).heartbeat_at < before


@pytest.mark.services
def test_concurrent_sweepers_resend_each_outbox_row_once(demo_tx, monkeypatch):
    monkeypatch.setattr("runs.services.outbox.outbox_deliver", lambda rows: 0)
    for _ in range(5):
        run_start(workflow="deploy-review")
    monkeypatch.undo()
    Outbox.objects.update(created_at=timezone.now() - timedelta(seconds=30))
    sent, lock = [], threading.Lock()

    def record(self, **kw):
        with lock:
            sent.append(kw["kwargs"]["task_id"])

    monkeypatch.setattr("dramatiq.Actor.send_with_options", record)
    run_at_once(4, lambda: resend_outbox(timezone.now()))
    assert sorted(sent) == sorted(Task.objects.filter(status="ready").values_list("id", flat=True))
    forgetter.flush()
    assert len(sent) == 10 and not Outbox.objects.exists()


def test_a_sent_row_is_forgotten_by_the_processs_thread_not_by_its_sender(demo_tx, sent):
    """The start's one transaction sends its messages after commit; the rows are deleted in a batch by
    the outbox thread, and a row it never got to (the process died) is the sweeper's to send again."""
    runs = [run_start(workflow="deploy-review") for _ in range(3)]
    assert len(sent) == 6
    forgetter.flush()
    assert not Outbox.objects.exists()
    assert {m["run_id"] for m in sent} == {r.id for r in runs}
