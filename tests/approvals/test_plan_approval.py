"""Plan approval (a workflow's ``approve_plans``): a planner's plan waits for a reviewer before any worker
starts; approved (as it is or edited) its tasks start, rejected the planner plans again with the comment;
once a worker started, a held re-plan can be approved or rejected but not edited."""

import pytest
from django.test import Client

from agents.models import Workflow
from approvals.services import approval_decide
from core.errors import Conflict
from policy.models import ApprovalRequest
from runs.models import Run, Task
from runs.services import run_start
from tenancy.access import default_project, membership_grant
from tests.conftest import wait_for
from tools.models import SandboxCall


@pytest.fixture
def held(demo_tx, django_user_model):
    Workflow.objects.filter(slug="incident-fanout").update(approve_plans=True)
    users = django_user_model.objects
    olivia = users.create_user(username="olivia", password="olivia-pass-1234")
    rita = users.create_user(username="rita", password="rita-pass-1234")
    membership_grant(user=olivia, project=default_project(), role="operator")
    membership_grant(user=rita, project=default_project(), role="reviewer")
    return olivia, rita


def _plan_request(run, n=1) -> ApprovalRequest:
    wait_for(
        lambda: (
            ApprovalRequest.objects.filter(run=run, kind="plan").count() >= n
            and Run.objects.get(id=run.id).status == Run.Status.WAITING_FOR_APPROVAL
        ),
        timeout=60,
        message=f"plan {n} to wait",
    )
    return ApprovalRequest.objects.filter(run=run, kind="plan").order_by("id")[n - 1]


def _workers(run):
    return Task.objects.filter(run=run, key__startswith="worker-")


def test_a_held_plan_starts_nothing_until_approved_and_its_card_shows_the_blast_radius(held, worker):
    olivia, rita = held
    run = run_start(workflow="incident-fanout", started_by=olivia)
    request = _plan_request(run)
    assert not _workers(run).exists() and not SandboxCall.objects.exists()
    assert [t["key"] for t in request.plan["tasks"]][:5] == [f"worker-{n}" for n in range(1, 6)]
    client = Client()
    client.force_login(rita)
    card = client.get("/approvals/").content.decode()
    assert "The plan: what starts once it is approved" in card and "irreversible calls it may make: email.send" in card
    starter = Client()
    starter.force_login(olivia)
    assert "another reviewer decides" in starter.get("/approvals/").content.decode()  # no buttons for her
    with pytest.raises(Exception, match="separation of duties"):
        approval_decide(request_id=request.id, user=olivia, approve=True, seen_hash=request.arguments_hash)

    approval_decide(request_id=request.id, user=rita, approve=True, seen_hash=request.arguments_hash)
    wait_for(lambda: Run.objects.get(id=run.id).is_terminal, timeout=60, message="the run")
    assert Run.objects.get(id=run.id).status == Run.Status.COMPLETED
    assert SandboxCall.objects.filter(tool="email.send", is_effect=True).count() == 5


def test_a_rejected_plan_is_planned_again_with_the_comment_and_an_edit_starts_only_what_was_kept(held, worker):
    olivia, rita = held
    run = run_start(workflow="incident-fanout", started_by=olivia)
    first = _plan_request(run)
    approval_decide(
        request_id=first.id, user=rita, approve=False, note="five e-mails is too many", seen_hash=first.arguments_hash
    )
    second = _plan_request(run, 2)
    replanner = Task.objects.filter(run=run).exclude(key="plan").get(agent__is_planner=True)
    assert "five e-mails is too many" in replanner.objective
    assert not _workers(run).exists()
    # Approved with an edit (while no worker has started): only the kept tasks start.
    edited = {"tasks": [t for t in second.plan["tasks"] if t["key"] in ("worker-1", "worker-2")]}
    for t in edited["tasks"]:
        t["depends_on"] = []
    approval_decide(
        request_id=second.id, user=rita, approve=True, note="two will do", seen_hash=second.arguments_hash,
        edited_arguments=edited,
    )  # fmt: skip
    wait_for(lambda: Run.objects.get(id=run.id).is_terminal, timeout=60, message="the run")
    assert sorted(_workers(run).values_list("key", flat=True)) == ["worker-1", "worker-2"]
    assert SandboxCall.objects.filter(tool="email.send", is_effect=True).count() == 2


def test_once_a_worker_started_a_held_re_plan_cannot_be_edited(held, worker):
    from django.db import transaction
    from django.utils import timezone

    from core import hooks

    olivia, rita = held
    run = run_start(workflow="incident-fanout", started_by=olivia)
    first = _plan_request(run)
    approval_decide(request_id=first.id, user=rita, approve=True, seen_hash=first.arguments_hash)
    wait_for(lambda: _workers(run).filter(started_at__isnull=False).exists(), timeout=60, message="a worker")
    # What a re-planner's answer does in a run whose workers are at work (runs/services/plans.py plan_held).
    again = {"tasks": [{"key": "follow-up", "agent": "incident-worker", "objective": "Check the customers again"}]}
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(id=run.id)
        planner = Task.objects.get(run=run, key="plan")
        request = hooks.call(hooks.PLAN_HOLD, run=locked, task=planner, plan=again, now=timezone.now())
    with pytest.raises(Conflict, match="no longer edited"):
        approval_decide(request_id=request.id, user=rita, approve=True, note="tweak", seen_hash=request.arguments_hash,
                        edited_arguments={"tasks": []})  # fmt: skip
    assert ApprovalRequest.objects.get(id=request.id).status == "pending"
