"""Re-planning after a task's quality failure: a new plan version that sees the world as it now is
(ledger and artifacts), old unstarted tasks superseded, tasks at work left to finish."""

import re

import pytest

from agents.models import Agent, Workflow
from core.errors import Conflict
from dashboard.bulk import bulk_apply, bulk_preview
from runs.models import Artifact, Run, Span, Task
from runs.services import run_start, task_retry
from tests.runs.test_engine import effects, finished
from tools.models import ToolOperation

DONE = {"type": "object", "required": ["summary"], "properties": {"summary": {"type": "string"}}}
# worker-3's third call (crm.update) fails for good, after its ticket was created by call 2.
FAIL_AFTER_TICKET = {"faults": [{"task": "worker-3", "call": 3, "mode": "error"}]}


def _plan(*tasks):
    return {"final": {"tasks": list(tasks)}}


def _task(key, agent, depends_on=(), objective=None):
    return {"key": key, "agent": agent, "objective": objective or f"Do {key}", "depends_on": list(depends_on)}


def _workflow(*, replan_turns, max_replans=1, worker_delay=None, slug="replanned"):
    """incident-worker tasks worker-1..3 and a summary; the planner's re-plan turns as given. worker-3
    (the one the drill faults fail) starts with a second's thought, so that its siblings have started by
    the time it fails: a sibling still queued would be superseded, and the scripted plan names them."""

    def delayed(slug, seconds):
        agent = Agent.objects.get(slug="incident-worker")
        agent.pk, agent.slug = None, slug
        agent.script = [{**agent.script[0], "delay": seconds}, *agent.script[1:]]
        agent.save()
        return slug

    worker = "incident-worker"
    late = delayed("late-worker", 1.0)
    if worker_delay:  # worker-1 takes its time on its first turn: still at work when worker-3 fails
        worker = delayed("slow-worker", worker_delay)
    Agent.objects.create(
        slug="rp-finisher",
        name="Finisher",
        output_schema=DONE,
        allowed_tools=["crm.update", "email.send"],
        script=[
            {"tool": "crm.update", "arguments": {"customer_id": "cust-worker-3", "fields": {"incident": "open"}}},
            {
                "tool": "email.send",
                "arguments": {"to": "worker-3@customers.example", "subject": "Incident", "body": "On it."},
            },
            {"final": {"summary": "customer 3 finished"}},
        ],
    )
    Agent.objects.create(
        slug="rp-summarizer", name="Summary", output_schema=DONE, script=[{"final": {"summary": "all done"}}]
    )
    planner = Agent.objects.create(
        slug="rp-planner",
        name="Planner",
        is_planner=True,
        max_attempts=1,
        script=[
            {
                "tasks": ["plan"],
                **_plan(
                    _task("worker-1", worker),
                    _task("worker-2", "incident-worker"),
                    _task("worker-3", late),
                    _task("summary", "rp-summarizer", ["worker-1", "worker-2", "worker-3"]),
                ),
            },
            *replan_turns,
        ],
    )
    agents = sorted({worker, late, "incident-worker", "rp-summarizer", "rp-finisher"})
    return Workflow.objects.create(
        slug=slug, name=slug, planner="agent", planner_agent=planner, max_replans=max_replans, agents=agents
    )


RECOVERY_PLAN = {
    "tasks": ["replan-2"],
    **_plan(
        _task("finish-3", "rp-finisher", objective="Customer 3 has its ticket already: update the record, e-mail"),
        _task("summary-2", "rp-summarizer", ["worker-1", "worker-2", "finish-3"]),
    ),
}


def test_a_failed_worker_sends_the_run_back_to_its_planner_which_sees_the_ledger(demo_tx, worker, operator, client):
    _workflow(replan_turns=[RECOVERY_PLAN])
    run = finished(run_start(workflow="replanned", input=FAIL_AFTER_TICKET))
    assert run.status == Run.Status.COMPLETED, run.status_reason
    assert run.plan_version == 2
    tasks = {t.key: t for t in run.tasks.all()}
    assert tasks["worker-3"].status == Task.Status.FAILED
    # The old summary had not started: superseded, never run. The new plan's tasks ran.
    assert tasks["summary"].status == Task.Status.SUPERSEDED and tasks["summary"].attempts == 0
    assert "superseded by plan 2" in tasks["summary"].status_reason
    assert {tasks[k].status for k in ("replan-2", "finish-3", "summary-2")} == {Task.Status.COMPLETED}
    assert tasks["finish-3"].plan_version == tasks["summary-2"].plan_version == 2
    assert not Artifact.objects.filter(run=run, key="summary").exists()
    # worker-3's ticket exists once: the new plan finished customer 3 without opening another.
    assert effects("tickets.create").filter(arguments__customer_id="cust-worker-3").count() == 1
    assert effects("email.send").count() == 3

    # The re-planner's prompt (kept on its model-call span) carried the world as it was: the failure,
    # the committed ticket with its external id, and the other workers' artifacts.
    ticket = ToolOperation.objects.get(run=run, task=tasks["worker-3"], tool="tickets.create")
    assert ticket.status == ToolOperation.Status.COMMITTED and ticket.external_id
    call = Span.objects.get(task=tasks["replan-2"], kind=Span.Kind.MODEL_CALL)
    prompt = call.body["request"]["user"]
    assert "Task worker-3 failed (permanent)" in prompt
    ledger_line = f"side effect {ticket.id}: tickets.create by worker-3 (action): committed, external id "
    assert ledger_line + ticket.external_id in prompt
    for other in ("worker-1", "worker-2"):  # done (with its artifact) or still at work, as it was then
        assert re.search(rf"task {other} \(incident-worker, plan 1\): (running|completed; artifact \{{)", prompt)
    assert "task worker-3 (late-worker, plan 1): failed (permanent): crm.update" in prompt
    assert "task summary (rp-summarizer, plan 1): superseded" in prompt
    # The trace says what happened, and the header counts the new plan's work only.
    replanned = Span.objects.get(run=run, kind=Span.Kind.PLAN, name="re-plan 2")
    assert replanned.attributes["superseded"] == ["summary"]
    assert replanned.attributes["failed_task"] == "worker-3"
    client.force_login(operator)
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert "re-plan 2" in page
    # Progress counts the current plan's work: summary (superseded) and worker-3 (replaced) are out.
    assert re.search(r"</progress> 6/6", page)
    assert f"/tasks/{tasks['worker-3'].id}/retry" not in page
    assert '<progress max="6" value="6">6 of 6</progress>' in client.get("/runs/").content.decode()


def test_a_task_still_at_work_when_the_plan_changes_finishes_and_the_new_plan_waits_for_it(demo_tx, worker):
    _workflow(replan_turns=[RECOVERY_PLAN], worker_delay=3.0)
    run = finished(run_start(workflow="replanned", input=FAIL_AFTER_TICKET))
    assert run.status == Run.Status.COMPLETED, run.status_reason
    tasks = {t.key: t for t in run.tasks.all()}
    # worker-1 was at work (its first, slow turn) when the re-plan came: it went on, and counted.
    assert tasks["worker-1"].plan_version == 1 and tasks["worker-1"].status == Task.Status.COMPLETED
    assert tasks["replan-2"].finished_at < tasks["worker-1"].finished_at
    assert Artifact.objects.filter(run=run, key="worker-1").count() == 1
    # summary-2 depended on it and started only after it finished.
    assert tasks["summary-2"].started_at >= tasks["worker-1"].finished_at


def test_a_new_plan_that_waits_for_a_failed_task_is_refused_with_the_reason(demo_tx, worker):
    bad = {"tasks": ["replan-2"], **_plan(_task("summary-2", "rp-summarizer", ["worker-3"]))}
    _workflow(replan_turns=[bad])
    run = finished(run_start(workflow="replanned", input=FAIL_AFTER_TICKET))
    assert run.status == Run.Status.NEEDS_ATTENTION
    assert "task replan-2 failed (validation)" in run.status_reason
    assert "'worker-3' will never complete" in run.status_reason
    assert not run.tasks.filter(key="summary-2").exists()


def test_re_plans_stop_at_the_workflow_limit_and_a_human_is_asked(demo_tx, worker, operator):
    # The new plan sends worker-3's customer to a task that fails the same way: no third plan.
    again = {"tasks": ["replan-2"], **_plan(_task("worker-3b", "incident-worker", objective="Try customer 3 again"))}
    _workflow(replan_turns=[again])
    faults = {"faults": [*FAIL_AFTER_TICKET["faults"], {"task": "worker-3b", "call": 1, "mode": "error"}]}
    run = finished(run_start(workflow="replanned", input=faults))
    assert run.status == Run.Status.NEEDS_ATTENTION
    assert run.plan_version == 2
    assert "task worker-3b failed (permanent)" in run.status_reason
    assert "not re-planned: the workflow allows 1 re-plan(s) and they are used" in run.status_reason
    # The old plan's failed task cannot be retried any more: the plan it belonged to was replaced.
    with pytest.raises(Conflict, match="plan 2 replaced"):
        task_retry(task_id=run.tasks.get(key="worker-3").id)
    # A bulk retry previews and retries the current plan's failed task only.
    assert bulk_preview(user=operator, action="retry", run_ids=[run.id]).effects == [(1, "failed tasks retried")]
    [outcome] = bulk_apply(user=operator, action="retry", run_ids=[run.id], reason="try again")
    assert outcome.message == "1 failed task retried"
    assert run.tasks.get(key="worker-3").status == Task.Status.FAILED
    assert run.tasks.get(key="worker-3b").attempts >= 1


def test_without_re_plans_a_failure_goes_to_a_human_as_before(demo_tx, worker):
    _workflow(replan_turns=[RECOVERY_PLAN], max_replans=0)
    run = finished(run_start(workflow="replanned", input=FAIL_AFTER_TICKET))
    assert run.status == Run.Status.NEEDS_ATTENTION
    assert run.plan_version == 1
    assert run.tasks.get(key="summary").status == Task.Status.PENDING
    assert "not re-planned" not in run.status_reason


def test_a_budget_failure_is_not_re_planned(demo_tx, worker):
    _workflow(replan_turns=[RECOVERY_PLAN])
    run = finished(run_start(workflow="replanned", budget={"max_tool_calls": 2}))
    assert run.status == Run.Status.NEEDS_ATTENTION
    assert run.plan_version == 1


def test_a_re_planned_run_in_propose_mode_completes_after_its_one_approval(demo_tx, worker, operator):
    from policy.models import ApprovalRequest
    from tests.conftest import decide, wait_for

    _workflow(replan_turns=[RECOVERY_PLAN])
    run = run_start(workflow="replanned", input={**FAIL_AFTER_TICKET, "propose_tools": ["email.send"]})
    wait_for(lambda: ApprovalRequest.objects.filter(run=run, parent=None).exists(), message="the bundle")
    bundle = ApprovalRequest.objects.get(run=run, parent=None)
    decide(request_id=bundle.id, user=operator, approve=True)
    run = finished(run)
    assert run.status == Run.Status.COMPLETED, run.status_reason
    assert run.plan_version == 2 and effects("email.send").count() == 3
