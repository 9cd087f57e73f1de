"""The engine end to end with worker threads in this process: retries, budgets, journal replay,
cancellation, recovery. Embedded mode runs exactly this way."""

import time

import pytest
from django.test import override_settings

from agents.models import Agent, Workflow
from core.errors import TransientFailure
from runs.models import Artifact, QuarantinedResult, Run, Span, Task
from runs.services import run_cancel, run_resume, run_start, sweep_once, task_retry
from tests.conftest import wait_for
from tools.installation import run_key_prefix
from tools.models import SandboxCall, ToolOperation


def finished(run, timeout=30) -> Run:
    def check():
        run.refresh_from_db()
        return run.status not in (Run.Status.RUNNING, Run.Status.PENDING, Run.Status.CANCELLING)

    wait_for(check, timeout=timeout, message=f"run {run.id} to stop")
    return run


def effects(tool):
    return SandboxCall.objects.filter(tool=tool, is_effect=True)


def scripted_workflow(slug, script, *, output_schema=None, tools=(), max_attempts=3, **agent):
    a = Agent.objects.create(
        slug=f"{slug}-agent",
        name=slug,
        script=script,
        allowed_tools=list(tools),
        output_schema=output_schema or {"type": "object"},
        max_attempts=max_attempts,
        **agent,
    )
    return Workflow.objects.create(slug=slug, name=slug, tasks=[{"key": "only", "agent": a.slug, "objective": "Do it"}])


def test_deploy_review_completes_with_the_verdict(demo_tx, worker):
    run = finished(run_start(workflow="deploy-review"))
    assert run.status == Run.Status.COMPLETED
    assert (
        Artifact.objects.get(run=run, key="verify").content["verdict"].startswith("APPROVE — Deployment checkout@v43")
    )
    assert run.steps_used == 5 and run.tokens_used > 0 and run.cost_micros > 0
    # usage of the run is the sum of its tasks' usage
    assert run.tokens_used == sum(run.tasks.values_list("tokens_used", flat=True))


def test_incident_fanout_is_planned_by_the_supervisor_and_summarised(demo_tx, worker):
    run = finished(run_start(workflow="incident-fanout"))
    assert run.status == Run.Status.COMPLETED, run.status_reason
    keys = set(run.tasks.values_list("key", flat=True))
    assert keys == {"plan", "summary", *(f"worker-{n}" for n in range(1, 6))}
    assert effects("email.send").count() == 5
    assert Task.objects.get(run=run, key="summary").depth == 1


def test_transient_failure_at_call_4_replays_calls_1_to_3_from_the_journal(demo_tx, worker):
    """Drill B1: no new effect reaches any system and call 4 reuses its idempotency key."""
    run = finished(
        run_start(workflow="incident-fanout", input={"faults": [{"task": "worker-3", "call": 4, "mode": "transient"}]})
    )
    assert run.status == Run.Status.COMPLETED, run.status_reason
    w3 = Task.objects.get(run=run, key="worker-3")
    assert w3.attempts == 2
    calls = SandboxCall.objects.filter(idempotency_key__startswith=f"{run_key_prefix(run.id)}worker-3:")
    assert list(calls.values_list("tool", flat=True)) == ["crm.read", "tickets.create", "crm.update", "email.send"]
    # attempt 2 made exactly one model call and one tool call: the e-mail and the final answer
    second = Span.objects.filter(task=w3, attempt=2, step__isnull=False).order_by("step")
    assert [(s.kind, s.name) for s in second] == [("tool_call", "email.send"), ("model_call", "scripted-1")]


def test_timeout_after_commit_is_reconciled_so_exactly_one_email_exists(demo_tx, worker):
    run = finished(
        run_start(
            workflow="incident-fanout",
            input={"faults": [{"task": "worker-3", "call": 4, "mode": "timeout_after_commit"}]},
        )
    )
    assert run.status == Run.Status.COMPLETED, run.status_reason
    assert effects("email.send").filter(idempotency_key__contains=":worker-3:").count() == 1


def test_permanent_tool_error_stops_the_run_for_a_human_without_retry(demo_tx, worker):
    run = finished(
        run_start(workflow="incident-fanout", input={"faults": [{"task": "worker-3", "call": 4, "mode": "error"}]})
    )
    assert run.status == Run.Status.NEEDS_ATTENTION
    assert "worker-3 failed (permanent)" in run.status_reason
    w3 = Task.objects.get(run=run, key="worker-3")
    assert (w3.status, w3.attempts) == (Task.Status.FAILED, 1)
    assert not effects("email.send").filter(idempotency_key__contains=":worker-3:").exists()
    assert effects("tickets.create").filter(idempotency_key__contains=":worker-3:").count() == 1


def test_a_budget_stops_the_run_before_the_call_that_could_cross_it_naming_the_budget(transactional_db, worker):
    wf = scripted_workflow("chatty", [{"say": "thinking out loud " * 20, "repeat": 20}, {"final": {}}])
    run = finished(run_start(workflow=wf.slug, budget={"max_tokens": 300}))
    assert run.status == Run.Status.NEEDS_ATTENTION
    assert run.status_reason.startswith("run budget exceeded: tokens (")
    assert "for the next call of 300)" in run.status_reason
    assert 0 < run.tokens_used <= 300  # the call that could have crossed it was not made
    task = run.tasks.get()
    assert (task.status, task.failure_class, task.attempts) == ("failed", "budget", 1)  # no retry
    assert 0 < task.steps_used < 20


def test_a_budget_too_small_for_the_next_calls_stops_the_run_and_starts_nothing_more(demo_tx, worker):
    run = finished(run_start(workflow="deploy-review", budget={"max_tokens": 150}))
    assert run.status == Run.Status.NEEDS_ATTENTION
    assert run.status_reason.startswith("run budget exceeded: tokens")
    # Nothing more starts. (When inventory and risk give their final answers at the same moment, both are
    # kept and verify becomes ready, as their outputs are all it waits for; it still does not start.)
    verify = run.tasks.get(key="verify")
    assert verify.status in (Task.Status.PENDING, Task.Status.READY) and verify.attempts == 0
    assert not Span.objects.filter(task=verify).exists()


def test_step_budget_stops_before_the_model_is_called(demo_tx, worker):
    run = finished(run_start(workflow="deploy-review", budget={"max_steps": 2}))
    assert run.status == Run.Status.NEEDS_ATTENTION
    assert "steps" in run.status_reason
    assert run.steps_used == 2


def test_invalid_final_output_fails_without_retry(transactional_db, worker):
    wf = scripted_workflow(
        "bad-output",
        [{"final": {"verdict": 42}}],
        output_schema={"type": "object", "required": ["verdict"], "properties": {"verdict": {"type": "string"}}},
    )
    run = finished(run_start(workflow=wf.slug))
    task = run.tasks.get()
    assert (task.status, task.failure_class, task.attempts) == ("failed", "validation", 1)
    assert "output does not match the schema" in task.status_reason
    assert not Artifact.objects.filter(run=run).exists()


def test_loop_guard_stops_a_task_repeating_the_same_call(demo_tx, worker):
    wf = scripted_workflow(
        "looping", [{"tool": "deployments.read", "arguments": {"service": "checkout"}}], tools=["deployments.read"]
    )
    run = finished(run_start(workflow=wf.slug))
    task = run.tasks.get()
    assert task.failure_class == "loop"
    # The second identical read came from the run's read cache; the third call never ran.
    assert SandboxCall.objects.filter(tool="deployments.read").count() == 1
    ops = list(ToolOperation.objects.filter(run=run).order_by("step"))
    assert [op.status_reason.startswith("cached from") for op in ops] == [False, True]


def test_a_tool_outside_the_allowlist_is_refused_back_to_the_model_and_not_called(demo_tx, worker):
    wf = scripted_workflow(
        "sneaky",
        [
            {"tool": "email.send", "arguments": {"to": "x@y.z", "subject": "s", "body": "b"}},
            {"final": {"ok": "{last}"}},
        ],
    )
    run = finished(run_start(workflow=wf.slug))
    assert run.status == Run.Status.COMPLETED
    result = Span.objects.get(run=run, kind="tool_call").body
    assert result["error"]["code"] == "not_allowed"
    assert not SandboxCall.objects.exists()


def test_cancelled_run_reaches_cancelled_within_grace_even_if_the_worker_ignores_it(demo_tx, worker, settings):
    wf = scripted_workflow("stubborn", [{"say": "not listening", "delay": 4}, {"final": {}}])
    run = run_start(workflow=wf.slug)
    wait_for(lambda: run.tasks.filter(status=Task.Status.RUNNING).exists(), message="the task to start")
    started = time.monotonic()
    run_cancel(run_id=run.id)
    grace = settings.WARDEN["CANCEL_GRACE_SECONDS"]
    wait_for(lambda: Run.objects.get(id=run.id).status == Run.Status.CANCELLED, timeout=grace + 2, message="the reaper")
    assert time.monotonic() - started < grace + 2
    assert run.tasks.get().status == Task.Status.CANCELLED
    # the stubborn worker's late step is quarantined, not applied
    late = wait_for(lambda: QuarantinedResult.objects.filter(run=run).first(), timeout=6, message="the late step")
    assert late.reason == QuarantinedResult.Reason.RUN_CANCELLED
    assert not Span.objects.filter(run=run, step__isnull=False).exists()
    # ...but the model call was made and paid for: it counts on the task and the run.
    run.refresh_from_db()
    assert run.tokens_used > 0 and run.cost_micros > 0
    assert run.tasks.get().tokens_used == run.tokens_used


def test_cooperative_cancel_stops_between_steps(demo_tx, worker):
    wf = scripted_workflow("polite", [{"say": "step", "delay": 0.3, "repeat": 50}, {"final": {}}])
    run = run_start(workflow=wf.slug)
    wait_for(lambda: run.tasks.filter(steps_used__gte=1).exists(), message="a first step")
    run_cancel(run_id=run.id)
    wait_for(
        lambda: Run.objects.get(id=run.id).status == Run.Status.CANCELLED,
        timeout=1.5,
        message="cooperative cancel (before the reaper's grace)",
    )
    assert run.tasks.get().status_reason == "run cancelled"


def test_lost_message_is_redriven_by_the_sweeper(demo_tx, monkeypatch):
    monkeypatch.setattr("runs.services.outbox.outbox_deliver", lambda rows: 0)  # the broker lost everything
    run = run_start(workflow="deploy-review")
    assert sweep_once()["tasks_redriven"] == 0  # too early: the messages may still be on their way
    Task.objects.filter(run=run).update(ready_at=run.created_at - __import__("datetime").timedelta(seconds=60))
    sent = []
    monkeypatch.setattr("dramatiq.Actor.send", lambda self, **kw: sent.append(kw))
    assert sweep_once()["tasks_redriven"] == 2
    assert sorted(m["task_id"] for m in sent) == sorted(run.tasks.filter(status="ready").values_list("id", flat=True))
    assert Span.objects.filter(run=run, kind="recovery", name="re-driven: not picked up").count() == 2


def test_code_version_change_pauses_the_run_until_resumed(demo_tx, worker, settings):
    run = run_start(workflow="deploy-review")
    finished(run)
    run2 = run_start(workflow="deploy-review")
    Run.objects.filter(id=run2.id).update(code_version="warden-0.0.9")
    finished(run2)
    assert run2.status == Run.Status.NEEDS_ATTENTION
    assert "code version changed from warden-0.0.9" in run2.status_reason
    run_resume(run_id=run2.id)
    assert finished(run2).status == Run.Status.COMPLETED


def test_operator_retry_of_a_failed_task_resumes_the_run(demo_tx, worker):
    run = finished(
        run_start(workflow="incident-fanout", input={"faults": [{"task": "worker-3", "call": 1, "mode": "error"}]})
    )
    assert run.status == Run.Status.NEEDS_ATTENTION
    Run.objects.filter(id=run.id).update(input={})  # the operator fixed the outside system
    task_retry(task_id=Task.objects.get(run=run, key="worker-3").id)
    assert finished(run).status == Run.Status.COMPLETED


def _task(key, agent="w", depends_on=()):
    return {"key": key, "agent": agent, "objective": key, "depends_on": list(depends_on)}


BAD_PLANS = {
    "a cycle": ([_task("a", depends_on=["b"]), _task("b", depends_on=["a"])], "the plan has a dependency cycle: "),
    "a fan-out over the cap": (
        [_task(f"t{i}") for i in range(51)],
        "the plan fans out to 51 tasks; a planner may add at most 50 at once",
    ),
    "an unknown agent": (
        [_task("a"), _task("b", agent="ghost")],
        "plan.tasks.b.agent: unknown agent 'ghost'",
    ),
    "an unknown task": ([_task("a", depends_on=["nowhere"])], "plan.tasks.a.depends_on: unknown task 'nowhere'"),
    "an agent outside the workflow": (
        [_task("a"), _task("b", agent="bad-planner")],
        "plan.tasks.b.agent: agent 'bad-planner' is not one of this workflow's agents",
    ),
}


@pytest.mark.parametrize("bad", BAD_PLANS)
def test_a_planner_proposing_a_bad_plan_is_refused_with_a_clear_reason(transactional_db, worker, bad):
    tasks, reason = BAD_PLANS[bad]
    Agent.objects.create(slug="w", name="w", script=[{"final": {}}])
    planner = Agent.objects.create(
        slug="bad-planner", name="p", is_planner=True, max_attempts=1, script=[{"final": {"tasks": tasks}}]
    )
    Workflow.objects.create(slug="bad-plan", name="b", planner="agent", planner_agent=planner, agents=["w"])
    run = finished(run_start(workflow="bad-plan"))
    assert run.status == Run.Status.NEEDS_ATTENTION
    assert run.status_reason.startswith("task plan failed (validation): invalid plan: ")
    assert reason in run.status_reason
    assert list(run.tasks.values_list("key", flat=True)) == ["plan"]  # nothing of the plan was created


@override_settings()
def test_concurrent_tasks_per_run_are_capped(transactional_db, worker, settings):
    settings.WARDEN = {**settings.WARDEN, "MAX_CONCURRENT_TASKS_PER_RUN": 2}
    a = Agent.objects.create(slug="sleepy", name="s", script=[{"say": "z", "delay": 0.3}, {"final": {}}])
    Workflow.objects.create(
        slug="wide", name="w", tasks=[{"key": f"t{i}", "agent": a.slug, "objective": "x"} for i in range(5)]
    )
    run = run_start(workflow="wide")
    peak = 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        peak = max(peak, run.tasks.filter(status=Task.Status.RUNNING).count())
        run.refresh_from_db()
        if run.status == Run.Status.COMPLETED:
            break
        time.sleep(0.02)
    assert run.status == Run.Status.COMPLETED
    assert peak == 2


def test_a_run_past_its_deadline_stops_for_a_human(transactional_db, worker):
    wf = scripted_workflow("slowpoke", [{"say": "hmm", "delay": 0.4, "repeat": 20}, {"final": {}}])
    run = finished(run_start(workflow=wf.slug, budget={"deadline_seconds": 1}), timeout=10)
    assert run.status == Run.Status.NEEDS_ATTENTION
    assert run.status_reason == "run budget exceeded: deadline"


def test_retry_backoff_grows_with_jitter_and_a_cap(settings):
    from runs.services.completion import retry_delay_seconds

    settings.WARDEN = {**settings.WARDEN, "RETRY_BASE_SECONDS": 1.0, "RETRY_CAP_SECONDS": 10.0}
    for attempt, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 10.0)]:
        delays = {retry_delay_seconds(attempt) for _ in range(50)}
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(delays) > 1  # jittered


def test_a_task_budget_from_the_plan_stops_that_task(transactional_db, worker):
    agent = Agent.objects.create(
        slug="ponder", name="p", script=[{"say": "hmm", "delay": 0.3, "repeat": 50}, {"final": {}}]
    )
    Workflow.objects.create(
        slug="budgeted",
        name="b",
        tasks=[
            {"key": "quick", "agent": agent.slug, "objective": "x", "budget": {"deadline_seconds": 1}},
            {"key": "short", "agent": agent.slug, "objective": "x", "budget": {"max_steps": 3}},
        ],
    )
    run = finished(run_start(workflow="budgeted"), timeout=15)
    assert run.status == Run.Status.NEEDS_ATTENTION
    # the first failure hands the run to a human; the other task still ends its attempt
    wait_for(lambda: not run.tasks.exclude(status=Task.Status.FAILED).exists(), timeout=10, message="both tasks")
    quick, short = run.tasks.get(key="quick"), run.tasks.get(key="short")
    assert quick.failure_class == "budget" and "task budget exceeded: deadline" in quick.status_reason
    assert quick.steps_used <= 4
    assert short.failure_class == "budget" and short.status_reason == "task budget exceeded: steps (3 of 3)"
    assert short.steps_used == 3


def test_large_step_bodies_are_stored_by_reference_and_replayed(transactional_db, worker):
    from runs.models import Payload

    wf = scripted_workflow(
        "bulky",
        [
            {"say": "{input[blob]}"},
            {"fail": "transient", "on_attempts": [1], "final": {"size": "{turn}"}},
        ],
    )
    run = finished(run_start(workflow=wf.slug, input={"blob": "x" * 40_000}))
    assert run.status == Run.Status.COMPLETED
    big = Span.objects.get(run=run, step=1)
    assert big.body is None and big.payload.size > 40_000
    assert Payload.objects.get(id=big.payload_id).body["text"] == "x" * 40_000
    assert run.tasks.get().attempts == 2  # the retry replayed step 1 from its payload
    assert Span.objects.filter(run=run, step__isnull=False).count() == 2


def test_the_trace_is_one_tree_run_task_attempt_call(demo_tx, worker):
    run = finished(run_start(workflow="deploy-review"))
    spans = {s.id: s for s in Span.objects.filter(run=run)}
    roots = [s for s in spans.values() if s.parent_id is None]
    assert [r.kind for r in roots] == ["run"]
    expected_parent = {"task": "run", "attempt": "task", "model_call": "attempt", "tool_call": "attempt"}
    for span in spans.values():
        if span.kind in expected_parent:
            assert spans[span.parent_id].kind == expected_parent[span.kind], span
            if span.kind != "task":
                assert spans[span.parent_id].task_id == span.task_id
    # usage on the spans adds up to the run's
    assert sum(s.tokens_in + s.tokens_out for s in spans.values()) == run.tokens_used
    assert sum(s.cost_micros for s in spans.values()) == run.cost_micros


def test_a_resumed_email_is_looked_up_before_it_is_sent_again(demo_tx, worker, monkeypatch):
    """The e-mail service sent the message, then the answer was lost: the retry must not send it twice."""
    import dataclasses

    from tools import registry

    spec = registry.TOOLS["email.send"]
    lost = []

    def send_then_lose_the_answer(args, *, key, **kwargs):
        result = spec.execute(args, key=key, **kwargs)
        if ":worker-3:" in key and not lost:
            lost.append(key)
            raise TransientFailure("connection reset after the message was accepted")
        return result

    monkeypatch.setitem(registry.TOOLS, "email.send", dataclasses.replace(spec, execute=send_then_lose_the_answer))
    run = finished(run_start(workflow="incident-fanout"))
    assert run.status == Run.Status.COMPLETED, run.status_reason
    assert Task.objects.get(run=run, key="worker-3").attempts == 2
    assert effects("email.send").filter(idempotency_key__contains=":worker-3:").count() == 1
    assert effects("email.send").count() == 5


def test_a_resumed_write_without_a_lookup_goes_to_a_human(demo_tx, worker, monkeypatch):
    import dataclasses

    from tools import registry

    spec = registry.TOOLS["email.send"]
    monkeypatch.setitem(registry.TOOLS, "email.send", dataclasses.replace(spec, lookup=None))
    fault = {"task": "worker-3", "call": 4, "mode": "timeout_after_commit"}
    run = finished(run_start(workflow="incident-fanout", input={"faults": [fault]}))
    assert run.status == Run.Status.NEEDS_ATTENTION
    w3 = Task.objects.get(run=run, key="worker-3")
    assert w3.failure_class == "ambiguous" and "a human must check" in w3.status_reason
    # never a blind retry: the one e-mail the service accepted is all there is, and the ledger says so
    assert effects("email.send").filter(idempotency_key__contains=":worker-3:").count() == 1
    op = ToolOperation.objects.get(run=run, task=w3, tool="email.send")
    assert op.status == ToolOperation.Status.AMBIGUOUS and op.attempts == 1


def test_a_timeout_on_a_system_whose_lookup_is_down_goes_to_a_human_and_is_never_retried(demo_tx, worker):
    fault = {"task": "worker-3", "call": 2, "mode": "timeout_no_lookup"}
    run = finished(run_start(workflow="incident-fanout", input={"faults": [fault]}))
    assert run.status == Run.Status.NEEDS_ATTENTION
    w3 = Task.objects.get(run=run, key="worker-3")
    assert w3.failure_class == "ambiguous" and "a human must check" in run.status_reason
    op = ToolOperation.objects.get(task=w3, tool="tickets.create")
    assert op.status == ToolOperation.Status.AMBIGUOUS
    # The ticket was made once; nobody could ask, so nobody made another.
    assert effects("tickets.create").filter(idempotency_key=op.idempotency_key).count() == 1
    assert not ToolOperation.objects.filter(task=w3, tool="crm.update").exists()


def test_a_rejected_input_stops_the_task_that_joins_it(demo_tx, monkeypatch):
    """Driven step by step (no worker): inventory finishes, an operator rejects its artifact, then risk
    finishes (and its worker goes straight on to verify), and verify stops at the join instead of
    giving a verdict built on the rejected input."""
    from runs.actors import execute_task
    from runs.services.artifacts import artifact_reject

    monkeypatch.setattr("runs.services.outbox.outbox_deliver", lambda rows: 0)  # no worker: this test drives
    run = run_start(workflow="deploy-review")
    execute_task.fn(run_id=run.id, task_id=run.tasks.get(key="inventory").id)
    inventory = Artifact.objects.get(task__key="inventory", run=run)
    assert inventory.verification == "unverified"
    artifact_reject(artifact_id=inventory.id, reason="wrong region")
    for _ in range(2):  # risk's first attempt fails by script (a model timeout)
        Task.objects.filter(run=run, key="risk").update(not_before=None)
        execute_task.fn(run_id=run.id, task_id=run.tasks.get(key="risk").id)

    verify = run.tasks.get(key="verify")
    assert verify.status == "failed" and verify.failure_class == "validation"
    assert f"the input from inventory (artifact {inventory.id}) was rejected" in verify.status_reason
    assert not Span.objects.filter(task=verify, kind="model_call").exists()  # its model never saw it
    assert Run.objects.get(id=run.id).status == "needs_attention"
    assert Artifact.objects.get(task__key="risk", run=run).verification == "unverified"  # nothing marked on a stop


def test_inputs_that_pass_the_join_are_marked_verified(demo_tx, worker):
    run = finished(run_start(workflow="deploy-review"))
    assert run.status == "completed"
    marks = dict(Artifact.objects.filter(run=run).values_list("task__key", "verification"))
    assert marks == {"inventory": "verified", "risk": "verified", "verify": "unverified"}  # verify has no reader
