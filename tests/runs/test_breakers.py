"""The tasks a breaker parked, and how they go on (runs/services/breakers.py): the sweeper probes a
half-open breaker by retrying one parked task, once per open period; once the breaker is closed, every
task it parked is retried; all of it audited as the system's, with the reason."""

import types

import pytest

from runs.heartbeat import lease_keeper
from runs.models import Run, Task
from runs.selectors import breakers_parked
from runs.services import breakers, run_start
from runs.services.breakers import breaker_resume_after_close, breakers_sweep
from tenancy.models import AuditEvent
from tests.runs.test_engine import scripted_workflow
from tests.runs.test_run_actions import drive
from tools.broker import BREAKER
from tools.models import SandboxCall

READ = {"tool": "crm.read", "arguments": {"customer_id": "cust-1"}}


class Clock:
    now = 2_000_000.0

    def time(self):
        return self.now


@pytest.fixture
def parked(db, settings, monkeypatch):
    """crm.read's breaker open (a deployment's: a registry tool), and two runs it parked."""
    settings.WARDEN = {**settings.WARDEN, "TOOL_CIRCUIT_FAILURES": 2, "TOOL_CIRCUIT_OPEN_SECONDS": 30}
    monkeypatch.setattr(lease_keeper, "hold", lambda task_id, token: None)
    clock = Clock()
    monkeypatch.setattr("core.circuit.time", types.SimpleNamespace(time=clock.time))
    monkeypatch.setattr(breakers, "_last_sweep", [0.0])
    for _ in range(2):
        BREAKER.record("crm.read", False)
    wf = scripted_workflow("reader", [READ, {"final": {"answer": "{last}"}}], tools=["crm.read"])
    runs = [drive(run_start(workflow=wf.slug)) for _ in range(2)]
    assert {r.status for r in runs} == {Run.Status.NEEDS_ATTENTION}
    tasks = list(Task.objects.filter(run__in=runs).order_by("id"))
    assert {t.failure_class for t in tasks} == {"breaker"}
    return types.SimpleNamespace(clock=clock, runs=runs, tasks=tasks)


def sweep():
    breakers._last_sweep[0] = 0.0  # the pass runs every few seconds: this test's passes are due
    return breakers_sweep(None)


def statuses(tasks) -> list[str]:
    return [Task.objects.get(id=t.id).status for t in tasks]


def test_parked_tasks_are_found_by_their_breaker(parked):
    [(ref, found)] = breakers_parked().items()
    assert ref == BREAKER.ref("crm.read") and [p.task_id for p in found] == [t.id for t in parked.tasks]
    assert breakers_parked(breaker=BREAKER.ref("crm.read", 1)) == {}  # a project's tool of the same name
    assert breakers_parked(project_ids=[]) == {}


def test_the_sweeper_probes_a_half_open_breaker_with_one_parked_task_once_per_open_period(parked):
    assert sweep() == {"breaker_probes": 0, "breaker_tasks_resumed": 0}  # open: nothing goes
    parked.clock.now += 31
    assert sweep()["breaker_probes"] == 1
    assert statuses(parked.tasks) == [Task.Status.READY, Task.Status.FAILED]  # the oldest is the probe
    [retry] = AuditEvent.objects.filter(action="task_retry")
    assert retry.actor is None and retry.via == "system" and "probe" in retry.detail["reason"]
    assert sweep()["breaker_probes"] == 0  # once per open period
    # The probe's call succeeds and closes the breaker; the sweeper then resumes the other task (the
    # close's message is the fast path: this test's transaction never commits, so it is not sent).
    assert drive(parked.runs[0]).status == Run.Status.COMPLETED
    assert BREAKER.state("crm.read").state == "closed"
    assert sweep()["breaker_tasks_resumed"] == 1
    assert drive(parked.runs[1]).status == Run.Status.COMPLETED
    assert SandboxCall.objects.filter(tool="crm.read").count() == 2  # the probe, then the other: once each
    retries = AuditEvent.objects.filter(action="task_retry", via="system").order_by("id")
    reasons = list(retries.values_list("detail", flat=True))
    assert len(reasons) == 2 and "closed" in reasons[1]["reason"] and reasons[1]["breaker"] == "tool:crm.read"


def test_a_probe_that_fails_parks_its_task_again_and_the_breaker_stays_open(parked, settings):
    parked.clock.now += 31
    assert sweep()["breaker_probes"] == 1
    parked.runs[0].input = {"faults": [{"task": "only", "call": 1, "mode": "transient"}]}
    Run.objects.filter(id=parked.runs[0].id).update(input=parked.runs[0].input)
    drive(parked.runs[0])
    probe = Task.objects.get(id=parked.tasks[0].id)
    assert probe.status == Task.Status.FAILED and probe.failure_class == "breaker"  # parked again, not spent
    assert BREAKER.state("crm.read").state == "open"
    assert sweep() == {"breaker_probes": 0, "breaker_tasks_resumed": 0}


def test_the_resume_after_a_close_leaves_them_parked_when_the_breaker_opened_again(parked):
    assert breaker_resume_after_close(what="tool", name="crm.read", project_id=None) == []
    assert statuses(parked.tasks) == [Task.Status.FAILED, Task.Status.FAILED]
    BREAKER.reset(["crm.read"])
    assert breaker_resume_after_close(what="tool", name="crm.read", project_id=None) == [t.id for t in parked.tasks]
    assert breaker_resume_after_close(what="nothing", name="crm.read", project_id=None) == []


def test_the_resume_actor_fed_its_message_twice_retries_each_task_once(parked):
    """resume_parked_tasks, delivered twice (at least once delivery): the second changes nothing."""
    from runs.actors import resume_parked_tasks

    BREAKER.reset(["crm.read"])
    resume_parked_tasks.fn(what="tool", name="crm.read", project_id=None)
    after_first = list(Task.objects.filter(id__in=[t.id for t in parked.tasks]).values("id", "status", "attempts"))
    retries = AuditEvent.objects.filter(action="task_retry").count()
    resume_parked_tasks.fn(what="tool", name="crm.read", project_id=None)
    assert (
        list(Task.objects.filter(id__in=[t.id for t in parked.tasks]).values("id", "status", "attempts")) == after_first
    )
    assert AuditEvent.objects.filter(action="task_retry").count() == retries == len(parked.tasks)
