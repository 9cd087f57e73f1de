"""The broker's checks, called directly: circuit breaker, rate limit, result validation, key reuse,
read cache, and the workflow's compensate-on-failure policy."""

import dataclasses

import pytest

from core.errors import StepFailure
from runs.models import Run, Task
from runs.services import run_start
from tests.conftest import wait_for
from tools import registry
from tools.broker import circuit_reset, tool_call
from tools.installation import run_key_prefix
from tools.kit import ToolUnavailable
from tools.models import SandboxCall, ToolOperation


@pytest.fixture
def call(demo):
    circuit_reset()
    run = run_start(workflow="incident-fanout")
    task = Task.objects.get(run=run, key="plan")
    task.allowed_tools = ["crm.read", "tickets.create", "email.send", "search.query"]
    steps = iter(range(1, 10_000))

    def make(name, arguments, *, step=None, faults=()):
        run.input = {"faults": [{"task": "plan", "call": 1, "mode": m} for m in faults]}
        return tool_call(run=run, task=task, step=step or next(steps), call_number=1, name=name, arguments=arguments)

    make.run = run
    yield make
    circuit_reset()


def test_consecutive_failures_open_the_circuit_and_calls_are_refused_without_reaching_the_system(
    call, settings, monkeypatch
):
    settings.WARDEN = {**settings.WARDEN, "TOOL_CIRCUIT_FAILURES": 3, "TOOL_CIRCUIT_OPEN_SECONDS": 30}
    spec = registry.TOOLS["email.send"]

    def down(arguments, **kwargs):
        raise ToolUnavailable("the e-mail system is down")

    # Unavailable: these count (a refusal does not: tests/tools/test_tool_refusals.py).
    monkeypatch.setitem(registry.TOOLS, "email.send", dataclasses.replace(spec, execute=down))
    for _ in range(3):
        with pytest.raises(StepFailure):
            call("email.send", {"to": "a@b.c", "subject": "s", "body": "b"})
    monkeypatch.setitem(registry.TOOLS, "email.send", spec)
    with pytest.raises(StepFailure) as parked:  # the task parks for a person; the model is not asked
        call("email.send", {"to": "a@b.c", "subject": "s", "body": "b"})
    assert parked.value.failure_class == "breaker"
    assert str(parked.value).startswith("the tool email.send is failing: its breaker is open for another")
    assert not SandboxCall.objects.filter(tool="email.send").exists()
    assert ToolOperation.objects.filter(tool="email.send").count() == 3  # the refused call left no intent
    # other tools are not affected; after a reset the tool works again
    assert call("crm.read", {"customer_id": "c1"}).error is None
    circuit_reset("email.send")
    assert call("email.send", {"to": "a@b.c", "subject": "s", "body": "b"}).error is None


def test_a_tool_over_its_rate_limit_is_refused(call, monkeypatch):
    import random
    import time
    import types

    spec = registry.TOOLS["search.query"]
    monkeypatch.setitem(registry.TOOLS, "search.query", dataclasses.replace(spec, rate_per_minute=2))
    # A fixed clock inside one minute window of its own, so a window boundary cannot split the calls.
    now = 60.0 * random.randrange(10**6, 10**7) + 1
    monkeypatch.setattr("core.circuit.time", types.SimpleNamespace(time=lambda: now, sleep=time.sleep))
    outcomes = [call("search.query", {"query": f"checkout {n}"}) for n in range(3)]
    assert [o.error["code"] if o.error else "ok" for o in outcomes] == ["ok", "ok", "rate_limited"]
    assert 0 < outcomes[-1].error["retry_after"] <= 60
    assert SandboxCall.objects.filter(tool="search.query").count() == 2


def test_an_invalid_result_is_not_shown_to_the_model_but_the_effect_is_recorded(call, monkeypatch):
    spec = registry.TOOLS["tickets.create"]

    def broken(arguments, **kwargs):
        spec.execute(arguments, **kwargs)
        return {"ticket": "T-1", "note": "\x00<script>"}  # not the declared result shape

    monkeypatch.setitem(registry.TOOLS, "tickets.create", dataclasses.replace(spec, execute=broken))
    outcome = call("tickets.create", {"customer_id": "c1", "title": "t"})
    assert outcome.error["code"] == "invalid_result" and outcome.result is None
    op = ToolOperation.objects.get(tool="tickets.create")
    assert op.status == ToolOperation.Status.COMMITTED and "does not match" in op.status_reason


def test_results_are_sanitised_before_the_model_sees_them(call, monkeypatch):
    spec = registry.TOOLS["crm.read"]

    def noisy(arguments, **kwargs):
        result = spec.execute(arguments, **kwargs)
        return {**result, "name": "Ann\x07\x1b[31m" + "x" * 10_000, "extra": "dropped"}

    monkeypatch.setitem(registry.TOOLS, "crm.read", dataclasses.replace(spec, execute=noisy))
    result = call("crm.read", {"customer_id": "c1"}).result
    assert "extra" not in result and "\x07" not in result["name"] and "\x1b" not in result["name"]
    assert len(result["name"]) == 4000


def test_a_key_reused_with_other_arguments_is_refused(call):
    call("tickets.create", {"customer_id": "c1", "title": "first"}, step=7)
    with pytest.raises(StepFailure, match="used before with other arguments"):
        call("tickets.create", {"customer_id": "c1", "title": "second"}, step=7)
    # the same arguments again: the stored receipt, nothing new in the tracker
    again = call("tickets.create", {"customer_id": "c1", "title": "first"}, step=7)
    assert again.result["status"] == "open"
    assert SandboxCall.objects.filter(tool="tickets.create", is_effect=True).count() == 1


def test_a_cacheable_read_is_served_once_per_run(call):
    first = call("search.query", {"query": "checkout runbook"})
    second = call("search.query", {"query": "checkout runbook"})
    assert first.result == second.result and first.result["hits"]
    assert SandboxCall.objects.filter(tool="search.query").count() == 1
    # crm.read is not cacheable: a record can change within a run
    call("crm.read", {"customer_id": "c1"})
    call("crm.read", {"customer_id": "c1"})
    assert SandboxCall.objects.filter(tool="crm.read").count() == 2


def test_a_workflow_that_compensates_on_failure_does_so_without_waiting_for_a_human(demo_tx, worker):
    from agents.models import Workflow
    from tools.models import SandboxTicket

    Workflow.objects.filter(slug="incident-fanout").update(compensate_on_failure=True)
    run = run_start(workflow="incident-fanout", input={"faults": [{"task": "worker-3", "call": 3, "mode": "error"}]})
    wait_for(
        lambda: Run.objects.get(id=run.id).status in (Run.Status.COMPENSATING, Run.Status.COMPENSATED),
        timeout=30,
        message="the policy to start the compensation",
    )
    wait_for(
        lambda: (
            not SandboxTicket.objects.filter(idempotency_key__startswith=run_key_prefix(run.id), status="open").exists()
        ),
        message="the run's tickets to be closed",
    )
    assert "policy" in Run.objects.get(id=run.id).status_reason


def test_a_slow_system_past_the_deadline_is_reconciled_then_called_again_with_the_same_key(call, monkeypatch):
    from core.errors import TransientFailure

    spec = registry.TOOLS["tickets.create"]
    monkeypatch.setitem(registry.TOOLS, "tickets.create", dataclasses.replace(spec, timeout_seconds=0.05))
    with pytest.raises(TransientFailure, match="did not take effect"):
        call("tickets.create", {"customer_id": "c1", "title": "t"}, step=3, faults=["slow"])
    op = ToolOperation.objects.get(tool="tickets.create")
    assert op.status == ToolOperation.Status.APPROVED and "not committed" in op.status_reason
    assert not SandboxCall.objects.filter(tool="tickets.create").exists()
    # the retry of the step: same key, the system answers in time
    outcome = call("tickets.create", {"customer_id": "c1", "title": "t"}, step=3)
    op.refresh_from_db()
    assert outcome.result["status"] == "open" and op.status == ToolOperation.Status.COMMITTED and op.attempts == 2
    # within its deadline a slow system is only slow
    monkeypatch.setitem(registry.TOOLS, "tickets.create", spec)
    assert call("tickets.create", {"customer_id": "c2", "title": "t"}, faults=["slow"]).result["status"] == "open"
    assert SandboxCall.objects.filter(tool="tickets.create", is_effect=True).count() == 2


def test_a_worker_that_lost_its_lease_after_writing_the_intent_does_not_make_the_call(call):
    """A worker frozen between its intent and its call wakes after another took the task over: the
    call must not leave a second time (the e-mail service would send it twice)."""
    from core.errors import LeaseLost

    task = Task.objects.get(run=call.run, key="plan")
    task.allowed_tools = ["email.send"]
    Task.objects.filter(id=task.id).update(status=Task.Status.RUNNING, fencing_token=7)
    mail = {"to": "a@x.example", "subject": "s", "body": "b"}
    with pytest.raises(LeaseLost, match="no longer holds the lease"):
        tool_call(
            run=call.run, task=task, step=40, call_number=1, name="email.send", arguments=mail, fence=(task.id, 6)
        )
    op = ToolOperation.objects.get(tool="email.send")
    assert op.status == ToolOperation.Status.EXECUTING  # the intent stays: the new holder reconciles it
    assert not SandboxCall.objects.filter(tool="email.send").exists()
    # The holder of token 7 goes on: asked by key, the system has nothing, so it makes the call, once.
    outcome = tool_call(
        run=call.run, task=task, step=40, call_number=1, name="email.send", arguments=mail, fence=(task.id, 7)
    )
    assert outcome.error is None and SandboxCall.objects.filter(tool="email.send", is_effect=True).count() == 1
