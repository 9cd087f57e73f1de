"""A worker whose lease expired and was taken over can change nothing (fencing)."""

import os
import signal

import pytest

from agents.models import Agent, Workflow
from runs.models import Artifact, QuarantinedResult, Run, Span, Task
from runs.services import run_start
from tests.conftest import wait_for

LEASE = 2.0


@pytest.fixture
def slow_workflow(transactional_db):
    agent = Agent.objects.create(
        slug="slow-agent",
        name="Slow",
        output_schema={"type": "object"},
        script=[{"say": "thinking slowly", "delay": 1.5}, {"final": {"answer": "done"}}],
    )
    return Workflow.objects.create(
        slug="slow", name="Slow", tasks=[{"key": "think", "agent": agent.slug, "objective": "Think"}]
    )


@pytest.mark.services
@pytest.mark.processes
def test_a_worker_frozen_past_its_lease_cannot_write_after_takeover(slow_workflow, processes):
    # The frozen worker's time limit is long on purpose: Dramatiq cannot interrupt blocking work,
    # so only the fencing token stands between its late result and the run.
    frozen_env = {"WARDEN_LEASE_SECONDS": LEASE, "WARDEN_HEARTBEAT_SECONDS": 0.3, "WARDEN_ACTOR_TIME_LIMIT_SECONDS": 60}
    run = run_start(workflow="slow")
    first = processes.worker(**frozen_env)
    task = wait_for(lambda: Task.objects.filter(run=run, status=Task.Status.RUNNING).first(), message="the first claim")
    owner_pid = int(task.lease_owner.split(":")[1])
    assert owner_pid in processes.children(first)
    os.kill(owner_pid, signal.SIGSTOP)  # frozen mid-step, heartbeat and all

    processes.worker(**frozen_env)
    wait_for(lambda: Run.objects.get(id=run.id).is_terminal, timeout=30, message="the takeover to finish the run")
    task.refresh_from_db()
    assert task.status == Task.Status.COMPLETED
    assert task.recoveries == 1
    successor_token = task.fencing_token
    assert successor_token > 1

    os.kill(owner_pid, signal.SIGCONT)  # the frozen worker wakes up and tries to journal its step
    quarantined = wait_for(
        lambda: QuarantinedResult.objects.filter(task=task).first(), timeout=15, message="the late result"
    )
    assert quarantined.fencing_token == 1
    assert quarantined.reason == QuarantinedResult.Reason.LEASE_LOST
    assert quarantined.body["text"] == "thinking slowly" and "tool_call" not in quarantined.body
    # Nothing of token 1 reached the journal, the artifact or the usage counters.
    journal = Span.objects.filter(task=task, step__isnull=False)
    assert set(journal.values_list("fencing_token", flat=True)) == {successor_token}
    assert journal.count() == 2
    assert Artifact.objects.filter(task=task).count() == 1
    assert Artifact.objects.get(task=task).provenance["fencing_token"] == successor_token
    run.refresh_from_db()
    assert run.steps_used == 2 and run.status == Run.Status.COMPLETED
