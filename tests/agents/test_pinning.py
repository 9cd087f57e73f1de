"""Whole pinning: a run keeps, to its end, the workflow version it started with (its tool policies,
re-plans, plan approval and compensation), whatever is edited meanwhile, and a new run takes the edit.
Approval policies bind a run as the stricter of their settings at its start and now: a tightening
reaches the runs in flight at once, a loosening only the runs started after it (docs/agents.md)."""

from django.db import transaction
from django.utils import timezone

from agents.models import Agent, Workflow
from policy.models import ApprovalPolicy, ApprovalRequest
from runs.models import Run, Task
from runs.schemas import PlannedTaskIn
from runs.services import run_start
from runs.services.plans import plan_held
from runs.services.replan import NO_REPLANNING, replan
from runs.services.runs import tasks_create
from saga.sweeps import compensate_by_policy
from tenancy.access import default_project, membership_grant
from tenancy.tokens import api_token_create
from tests.conftest import decide, wait_for
from tests.runs.test_engine import finished, scripted_workflow
from tools.gate import ALLOW, APPROVAL, Origin, gate
from tools.models import SandboxEmail

MAIL = {"to": "a@x.example", "subject": "Refund issued", "body": "b"}
DEMO_WAIVER = "Demo: the sandbox's email.send leaves without a reviewer"


def edit(slug: str, **changes) -> Workflow:
    """An admin's edit of the workflow: saved, so it makes the workflow's next version."""
    wf = Workflow.objects.get(slug=slug)
    for name, value in changes.items():
        setattr(wf, name, value)
    wf.save()
    return wf


def verdict(run, tool="email.send", arguments=MAIL):
    return gate(run_id=run.id, tool=tool, arguments=arguments, origin=Origin.AGENT)


def test_a_tool_policy_loosened_mid_run_does_not_reach_the_run_in_flight(demo_tx, worker, django_user_model, client):
    reviewer = django_user_model.objects.create_user(username="rita", password="x-pass-123456")
    membership_grant(user=reviewer, project=default_project(), role="reviewer")
    script = [
        {"tool": "email.send", "arguments": MAIL},
        {"tool": "email.send", "arguments": {**MAIL, "subject": "Second"}},
        {"final": {"sent": 2}},
    ]
    scripted_workflow("mailer", script, tools=["email.send"])
    edit("mailer", tool_policies={"email.send": {"approval": "always"}})
    run = run_start(workflow="mailer")
    wait_for(lambda: ApprovalRequest.objects.filter(run=run, status="pending").exists(), message="the first mail")

    edit("mailer", tool_policies={})  # loosened while the run waits
    decide(request_id=ApprovalRequest.objects.get(run=run, status="pending").id, user=reviewer, approve=True)
    # The second mail waits for a reviewer too: the run keeps the policy it started with.
    wait_for(lambda: ApprovalRequest.objects.filter(run=run, status="pending").exists(), message="the second mail")
    assert SandboxEmail.objects.count() == 1
    decide(request_id=ApprovalRequest.objects.get(run=run, status="pending").id, user=reviewer, approve=True)
    assert finished(run).status == Run.Status.COMPLETED, run.status_reason

    later = finished(run_start(workflow="mailer"))  # the new run takes the edit: nothing waits
    assert later.status == Run.Status.COMPLETED and not ApprovalRequest.objects.filter(run=later).exists()
    assert (run.workflow_version.number, later.workflow_version.number) == (2, 3)

    # The API's run and the run page say which workflow version each run keeps.
    token = api_token_create(user=reviewer)[1]
    body = client.get(f"/api/v1/runs/{run.id}", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert body["versions"]["workflow"] == {"id": run.workflow_version_id, "version": 2}
    client.force_login(reviewer)
    assert "workflow v3" in client.get(f"/runs/{later.id}/").content.decode()


def test_a_tightened_tool_policy_waits_for_the_next_run(demo):
    scripted_workflow("mailer", [{"final": {}}], tools=["email.send"])
    run = run_start(workflow="mailer")
    edit("mailer", tool_policies={"email.send": {"approval": "always"}})
    assert verdict(run).decision == ALLOW  # the version it started with
    assert verdict(run_start(workflow="mailer")).decision == APPROVAL


def _planner_run(*, max_replans: int):
    edit("incident-fanout", max_replans=max_replans)
    run = run_start(workflow="incident-fanout")
    return run


def _worker_failed(run, key: str = "worker-1") -> str:
    """A worker of the run's plan fails for good with an invalid output: does the run go back to its
    planner? ('' when it does, else why not.)"""
    now = timezone.now()
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(id=run.id)
        agent = Agent.objects.get(slug="incident-worker")
        [task] = tasks_create(
            run=locked,
            planned=[PlannedTaskIn(key=key, agent=agent.slug, objective="Handle a customer")],
            agents={agent.slug: agent},
            depth=1,
            now=now,
        )
        Task.objects.filter(id=task.id).update(status=Task.Status.FAILED, attempts=1)
        return replan(run=locked, task=task, failure_class=Task.FailureClass.VALIDATION, reason="bad", now=now)


def test_max_replans_changed_mid_run_keeps_the_start_versions_limit(demo):
    run = _planner_run(max_replans=1)
    edit("incident-fanout", max_replans=0)
    assert _worker_failed(run) == ""  # re-planned, as its version allows
    assert Task.objects.filter(run=run, key="replan-2").exists()
    assert _worker_failed(run_start(workflow="incident-fanout")) == NO_REPLANNING  # the new run: none

    edit("incident-fanout", max_replans=3)  # raised, it does not reach the run in flight either
    assert _worker_failed(run, key="worker-2") == "the workflow allows 1 re-plan(s) and they are used"


def _planner_finished(run) -> bool:
    """The run's planner hands in its plan: is it held for a reviewer?"""
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(id=run.id)
        task = Task.objects.get(run=run, key="plan")
        plan = {"tasks": [{"key": "worker-1", "agent": "incident-worker", "objective": "Handle customer 1"}]}
        return plan_held(locked, task, plan, timezone.now())


def test_approve_plans_turned_off_mid_run_still_holds_that_runs_plan(demo):
    edit("incident-fanout", approve_plans=True)
    run = run_start(workflow="incident-fanout")
    edit("incident-fanout", approve_plans=False)
    assert _planner_finished(run) is True
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING_FOR_APPROVAL
    assert ApprovalRequest.objects.filter(run=run, kind=ApprovalRequest.Kind.PLAN).exists()
    later = run_start(workflow="incident-fanout")
    assert _planner_finished(later) is False and not ApprovalRequest.objects.filter(run=later).exists()


def _needs_attention_after_a_failure(run) -> None:
    Task.objects.filter(run=run).update(status=Task.Status.FAILED, failure_class=Task.FailureClass.PERMANENT)
    Run.objects.filter(id=run.id).update(status=Run.Status.NEEDS_ATTENTION, status_reason="a task failed")


def test_compensate_on_failure_changed_mid_run_keeps_the_start_versions_choice(demo):
    scripted_workflow("undoer", [{"final": {}}])
    edit("undoer", compensate_on_failure=True)
    compensating = run_start(workflow="undoer")
    edit("undoer", compensate_on_failure=False)
    waiting = run_start(workflow="undoer")
    edit("undoer", compensate_on_failure=True)  # turned on again: the run started without it still waits
    for run in (compensating, waiting):
        _needs_attention_after_a_failure(run)

    assert compensate_by_policy(timezone.now()) == 1
    compensating.refresh_from_db()
    waiting.refresh_from_db()
    assert compensating.status in (Run.Status.COMPENSATING, Run.Status.COMPENSATED)
    assert waiting.status == Run.Status.NEEDS_ATTENTION


def test_an_approval_policy_tightened_mid_run_reaches_the_run_loosened_does_not(demo):
    scripted_workflow("mailer", [{"final": {}}], tools=["email.send"])
    policy = ApprovalPolicy.objects.create(name="mails wait", tool="email.send", quorum=1)
    run = run_start(workflow="mailer")
    assert (verdict(run).decision, verdict(run).quorum) == (APPROVAL, 1)

    policy.quorum = 2  # tightened: at once
    policy.save()
    assert (verdict(run).decision, verdict(run).quorum) == (APPROVAL, 2)
    ApprovalPolicy.objects.create(name="admins decide", tool="email.send", decided_by_role="admin")
    assert verdict(run).admins_only

    policy.enabled = False  # loosened: the run keeps what it started with (one reviewer)...
    policy.save()
    ApprovalPolicy.objects.filter(name="admins decide").delete()
    assert (verdict(run).decision, verdict(run).quorum, verdict(run).admins_only) == (APPROVAL, 1, False)
    assert "as it was when the run started" in verdict(run).summary()
    assert verdict(run_start(workflow="mailer")).decision == ALLOW  # ...a new run does not


def test_a_waiver_removed_mid_run_binds_at_once_and_one_added_only_new_runs(demo):
    """email.send is irreversible; the demo project waives its review. A waiver loosens, so it lifts a
    run's review only if it was in force at the start and still is."""
    scripted_workflow("mailer", [{"final": {}}], tools=["email.send"])
    waiver = ApprovalPolicy.objects.get(name=DEMO_WAIVER)
    run = run_start(workflow="mailer")
    assert verdict(run).decision == ALLOW

    waiver.enabled = False  # removing it tightens: the run in flight waits at once
    waiver.save()
    assert verdict(run).decision == APPROVAL
    without = run_start(workflow="mailer")

    waiver.enabled = True  # added back, it loosens: only runs started afterwards leave without a reviewer
    waiver.save()
    assert verdict(without).decision == APPROVAL
    assert verdict(run_start(workflow="mailer")).decision == ALLOW
