"""Drill A (docs/scenarios.md): deploy-review resumes after its worker dies, and never restarts."""

import json
import os
import signal
import urllib.request

import pytest

from runs.models import Artifact, FaultFiring, Run, Span, Task
from runs.services import run_start
from tenancy.tokens import api_token_create
from tests.conftest import free_port, wait_for
from tools.models import SandboxCall

CRASH_BEFORE_VERIFY = {"faults": [{"task": "verify", "at": "start", "mode": "crash"}]}


def _task(run, key) -> Task:
    return Task.objects.get(run=run, key=key)


def assert_resumed_not_restarted(run: Run, *, spans_before_restart: int):
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED, run.status_reason
    # deployments.read reached the deployment inventory exactly once
    assert SandboxCall.objects.filter(system="deployments").count() == 1
    # risk was retried once after its transient model timeout; the trace shows both attempts
    risk = _task(run, "risk")
    assert risk.attempts == 2
    attempts = list(Span.objects.filter(task=risk, kind=Span.Kind.ATTEMPT).order_by("attempt"))
    assert [(a.attempt, a.status) for a in attempts] == [(1, "error"), (2, "ok")]
    assert "model timeout" in attempts[0].attributes["error"]
    # after the restart only verify ran, once, and the trace shows the recovery
    later = Span.objects.filter(run=run, id__gt=spans_before_restart).exclude(kind=Span.Kind.RECOVERY)
    assert {s.task.key for s in later} == {"verify"}
    verify = _task(run, "verify")
    assert verify.attempts == 1
    assert Span.objects.filter(task=verify, kind=Span.Kind.MODEL_CALL).count() == 1
    assert Span.objects.filter(run=run, kind=Span.Kind.RECOVERY, id__gt=spans_before_restart).exists()
    # inventory and risk were not re-executed: one journal of each, written before the crash
    assert not Span.objects.filter(run=run, task__key__in=["inventory", "risk"], id__gt=spans_before_restart).exists()
    verdict = Artifact.objects.get(task=verify).content["verdict"]
    assert verdict == (
        "APPROVE — Deployment checkout@v43: 12 pods in eu-west-1; "
        "Risk review: backward-compatible schema; tested rollback available"
    )


@pytest.mark.services
@pytest.mark.processes
def test_deploy_review_resumes_on_a_fresh_worker_after_sigkill(demo_tx, processes):
    run = run_start(workflow="deploy-review", input=CRASH_BEFORE_VERIFY)
    first = processes.worker()
    # The worker checkpoints inventory and risk, then dies by SIGKILL as verify is about to start.
    wait_for(lambda: first.poll() is not None, timeout=60, message="the first worker to die")
    assert FaultFiring.objects.filter(run=run, task_key="verify").exists()
    assert {t.key: t.status for t in run.tasks.all()} == {
        "inventory": "completed",
        "risk": "completed",
        "verify": "ready",
    }, processes.log(first)
    # Dramatiq's main process exits with RET_KILLED (1) when a worker process was killed; the worker
    # process that checkpointed risk is gone.
    assert first.returncode == 1
    worker_pid = int(
        Span.objects.get(task__run=run, task__key="risk", attempt=2, kind="attempt").attributes["worker"].split(":")[1]
    )
    with pytest.raises(ProcessLookupError):
        os.kill(worker_pid, 0)
    spans_before = Span.objects.filter(run=run).order_by("-id").values_list("id", flat=True).first()

    processes.worker()
    wait_for(lambda: Run.objects.get(id=run.id).is_terminal, timeout=60, message="the run to finish")
    assert_resumed_not_restarted(run, spans_before_restart=spans_before)


@pytest.mark.embedded
@pytest.mark.processes
def test_deploy_review_resumes_after_an_embedded_server_restart(demo_tx, operator, processes):
    _, token = api_token_create(user=operator)
    port = free_port()
    server = processes.server(port=port)

    def start_run():
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/v1/runs",
            method="POST",
            data=json.dumps({"workflow": "deploy-review", "input": CRASH_BEFORE_VERIFY}).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return json.loads(response.read())
        except OSError:
            return None  # not listening yet

    created = wait_for(start_run, timeout=30, interval=0.2, message="the server to accept the run")
    run = Run.objects.get(id=created["id"])
    wait_for(lambda: server.poll() is not None, timeout=60, message="the server to die at verify")
    assert server.returncode == -signal.SIGKILL
    assert _task(run, "verify").status == Task.Status.READY
    spans_before = Span.objects.filter(run=run).order_by("-id").values_list("id", flat=True).first()

    processes.server(port=port)
    wait_for(lambda: Run.objects.get(id=run.id).is_terminal, timeout=60, message="the run to finish")
    assert_resumed_not_restarted(run, spans_before_restart=spans_before)


@pytest.mark.embedded
@pytest.mark.processes
def test_a_graceful_restart_during_a_retry_backoff_loses_nothing(demo_tx, processes):
    """The in-memory broker forgets the delayed retry; the restarted server's sweeper re-drives it."""
    slow_backoff = {"WARDEN_RETRY_BASE_SECONDS": 4, "WARDEN_RETRY_CAP_SECONDS": 8}
    run = run_start(workflow="deploy-review")
    server = processes.server(port=free_port(), **slow_backoff)
    wait_for(
        lambda: _task(run, "risk").status == Task.Status.RETRY_WAIT and _task(run, "inventory").status == "completed",
        timeout=30,
        message="risk to wait for its retry",
    )
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=30) is not None
    assert _task(run, "risk").status == Task.Status.RETRY_WAIT

    processes.server(port=free_port(), **slow_backoff)
    wait_for(lambda: Run.objects.get(id=run.id).is_terminal, timeout=60, message="the run to finish")
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED
    assert SandboxCall.objects.filter(system="deployments").count() == 1
    assert _task(run, "risk").attempts == 2 and _task(run, "verify").attempts == 1
