"""Decisions: bound to the arguments seen, one per reviewer, quorum, edits, items of a bundle, a recheck
just before execution, and exactly one outcome when many reviewers click at once."""

import threading

import pytest
from django.db import connection

from approvals.services import approval_decide
from core.errors import Conflict, Forbidden, InvalidInput
from policy.models import ApprovalRequest, Decision
from runs.models import Run, Task
from runs.services import run_start
from tenancy.access import default_project, membership_grant
from tenancy.models import AuditEvent
from tests.conftest import decide, wait_for
from tests.runs.test_engine import finished, scripted_workflow
from tools.broker import TaskParked, tool_call
from tools.installation import run_key_prefix
from tools.models import SandboxCall, SandboxEmail, ToolOperation

MAIL = {"to": "a@x.example", "subject": "Refund issued", "body": "b"}


def gated_workflow(quorum=1, slug="gated"):
    script = [{"tool": "email.send", "arguments": MAIL}, {"final": {"outcome": "{last}"}}]
    wf = scripted_workflow(slug, script, tools=["email.send"])
    wf.tool_policies = {"email.send": {"approval": "always", "quorum": quorum}}
    wf.save()
    return wf


@pytest.fixture
def reviewers(django_user_model):
    def make(n, role="reviewer"):
        people = []
        for i in range(n):
            user = django_user_model.objects.create_user(username=f"{role}-{i}", password="pass-123-pass")
            membership_grant(user=user, project=default_project(), role=role)
            people.append(user)
        return people

    return make


def parked(run) -> ApprovalRequest:
    wait_for(lambda: ApprovalRequest.objects.filter(run=run, status="pending").exists(), message="a request")
    return ApprovalRequest.objects.get(run=run, status="pending")


def emails():
    return SandboxCall.objects.filter(tool="email.send", is_effect=True).count()


def test_a_decision_on_arguments_that_changed_since_display_executes_nothing(demo_tx, worker, reviewers):
    (rita,) = reviewers(1)
    run = run_start(workflow=gated_workflow().slug)
    request = parked(run)
    with pytest.raises(Conflict, match="changed since you saw them"):
        approval_decide(request_id=request.id, user=rita, approve=True, seen_hash="0" * 64)
    request.refresh_from_db()
    assert request.status == "pending" and not Decision.objects.exists() and emails() == 0
    assert AuditEvent.objects.filter(actor=rita, action="decide", outcome="denied").exists()
    approval_decide(request_id=request.id, user=rita, approve=True, seen_hash=request.arguments_hash)
    assert finished(run).status == Run.Status.COMPLETED and emails() == 1


def test_edited_arguments_execute_as_edited_and_both_versions_are_kept(demo_tx, worker, reviewers):
    (rita,) = reviewers(1)
    run = run_start(workflow=gated_workflow().slug)
    request = parked(run)
    with pytest.raises(InvalidInput):  # not a valid e-mail address: refused, nothing changes
        decide(request_id=request.id, user=rita, approve=True, note="fix", edited_arguments={"to": "nobody"})
    with pytest.raises(InvalidInput, match="comment"):
        decide(request_id=request.id, user=rita, approve=True, edited_arguments={"subject": "x"})
    assert ApprovalRequest.objects.get(id=request.id).status == "pending" and not Decision.objects.exists()
    approval_decide(
        request_id=request.id,
        user=rita,
        approve=True,
        note="softer subject",
        seen_hash=request.arguments_hash,
        edited_arguments={"subject": "About your refund"},
    )
    assert finished(run).status == Run.Status.COMPLETED, run.status_reason
    (mail,) = SandboxEmail.objects.all()
    assert mail.subject == "About your refund"
    op = ToolOperation.objects.get(tool="email.send")
    assert op.original_arguments["subject"] == "Refund issued" and op.arguments["subject"] == "About your refund"
    assert Decision.objects.get().edited_arguments == {"subject": "About your refund"}


def test_under_a_quorum_an_edit_counts_only_approvals_of_the_edited_arguments(demo_tx, worker, reviewers):
    rita, sam = reviewers(2)
    run = run_start(workflow=gated_workflow(quorum=2).slug)
    request = parked(run)
    decide(request_id=request.id, user=rita, approve=True)
    # Rita approved the arguments as they were: Sam may not change them under her approval.
    edit = {"subject": "About your refund"}
    with pytest.raises(Conflict, match="already has approvals"):
        decide(request_id=request.id, user=sam, approve=True, note="softer", edited_arguments=edit)
    assert ToolOperation.objects.get(tool="email.send").arguments["subject"] == "Refund issued"
    assert ApprovalRequest.objects.get(id=request.id).status == "pending"

    # Edited first, the edited arguments are what the quorum approves, and what is sent.
    other = run_start(workflow=gated_workflow(quorum=2, slug="gated-2").slug)
    second = parked(other)
    decide(request_id=second.id, user=sam, approve=True, note="softer", edited_arguments=edit)
    second.refresh_from_db()
    approval_decide(request_id=second.id, user=rita, approve=True, seen_hash=second.arguments_hash)
    assert finished(other).status == Run.Status.COMPLETED, other.status_reason
    assert SandboxEmail.objects.get(idempotency_key__startswith=run_key_prefix(other.id)).subject == "About your refund"


def test_a_quorum_needs_distinct_reviewers_and_one_rejection_with_a_comment_rejects(demo_tx, worker, reviewers):
    rita, sam, tom = reviewers(3)
    run = run_start(workflow=gated_workflow(quorum=2).slug)
    request = parked(run)
    decide(request_id=request.id, user=rita, approve=True)
    assert ApprovalRequest.objects.get(id=request.id).status == "pending" and emails() == 0
    with pytest.raises(Conflict, match="already decided"):
        decide(request_id=request.id, user=rita, approve=True)
    with pytest.raises(InvalidInput, match="comment"):
        decide(request_id=request.id, user=sam, approve=False)
    decide(request_id=request.id, user=sam, approve=True)
    assert ApprovalRequest.objects.get(id=request.id).status == "approved"
    assert finished(run).status == Run.Status.COMPLETED and emails() == 1
    with pytest.raises(Conflict):
        decide(request_id=request.id, user=tom, approve=False, note="too late")


def test_a_rejection_reaches_the_agent_with_the_reviewers_comment(demo_tx, worker, reviewers):
    from runs.models import Artifact

    (rita,) = reviewers(1)
    run = run_start(workflow=gated_workflow().slug)
    decide(request_id=parked(run).id, user=rita, approve=False, note="wrong customer")
    assert finished(run).status == Run.Status.COMPLETED
    assert "wrong customer" in Artifact.objects.get(run=run).content["outcome"] and emails() == 0


def test_each_item_of_a_bundle_can_be_decided_alone(demo_tx, worker, reviewers):
    (rita,) = reviewers(1)
    run = run_start(workflow="incident-fanout", input={"propose_tools": ["email.send"]})
    wait_for(lambda: Run.objects.get(id=run.id).status == Run.Status.WAITING_FOR_APPROVAL, message="the bundle")
    bundle = ApprovalRequest.objects.get(run=run, parent=None)
    first = bundle.items.order_by("id").first()
    decide(request_id=first.id, user=rita, approve=False, note="this customer was already told")
    assert ApprovalRequest.objects.get(id=bundle.id).status == "pending" and emails() == 0
    decide(request_id=bundle.id, user=rita, approve=True)
    assert finished(run).status == Run.Status.COMPLETED, run.status_reason
    assert emails() == 4
    assert ToolOperation.objects.get(approval=first).status == ToolOperation.Status.REJECTED


def test_an_approval_is_rechecked_just_before_execution(demo, reviewers):
    """The reviewer lost the role between the decision and the call: the call is not made."""
    (rita,) = reviewers(1)
    wf = gated_workflow()
    run = run_start(workflow=wf.slug)
    task = Task.objects.get(run=run)
    call = dict(run=run, task=task, step=2, call_number=1, name="email.send", arguments=MAIL)
    with pytest.raises(TaskParked):
        tool_call(**call)
    request = ApprovalRequest.objects.get(run=run)
    decide(request_id=request.id, user=rita, approve=True)
    rita.memberships.update(role="viewer")
    outcome = tool_call(**call, resumed=True)
    assert outcome.error["code"] == "rejected" and "no longer" in outcome.error["message"]
    assert ToolOperation.objects.get().status == ToolOperation.Status.REJECTED and emails() == 0


def test_self_approval_is_refused(demo_tx, worker, reviewers):
    (rita,) = reviewers(1)
    run = run_start(workflow=gated_workflow().slug, started_by=rita)
    request = parked(run)
    with pytest.raises(Forbidden, match="separation of duties"):
        decide(request_id=request.id, user=rita, approve=True)
    assert ApprovalRequest.objects.get(id=request.id).status == "pending"
    denied = AuditEvent.objects.get(actor=rita, action="decide", outcome="denied")
    assert "separation of duties" in denied.detail["why"] and denied.run_id == run.id


@pytest.mark.services
def test_twenty_reviewers_at_once_make_exactly_one_outcome_one_resume_and_one_execution(demo_tx, worker, reviewers):
    people = reviewers(20)
    run = run_start(workflow=gated_workflow().slug)
    request = parked(run)
    barrier, outcomes = threading.Barrier(20), []

    def one_reviewer(user, approve):
        barrier.wait()
        try:
            decide(request_id=request.id, user=user, approve=approve, note="" if approve else "no")
            outcomes.append("decided")
        except Conflict:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=one_reviewer, args=(u, n % 2 == 0)) for n, u in enumerate(people)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("decided") == 1 and outcomes.count("refused") == 19
    assert Decision.objects.filter(request=request).count() == 1
    finished(run)
    request.refresh_from_db()
    task = Task.objects.get(run=run)
    assert task.attempts == 1  # resumed once, in the same attempt
    assert emails() == (1 if request.status == "approved" else 0)
    assert AuditEvent.objects.filter(action__startswith="decide:").count() == 1
    assert AuditEvent.objects.filter(action="decide", outcome="denied").count() == 19


def test_an_approved_call_whose_arguments_changed_after_the_approval_is_not_executed(demo_tx, worker, reviewers):
    rita, sam = reviewers(2)
    run = run_start(workflow=gated_workflow(quorum=2).slug)
    request = parked(run)
    decide(request_id=request.id, user=rita, approve=True)
    # A data fix (or a bug) changes what the ledger would send, after the reviewers saw it.
    ToolOperation.objects.filter(approval=request).update(arguments_hash="f" * 64)
    decide(request_id=request.id, user=sam, approve=True)
    run = finished(run)
    # The broker compares the call with its ledger row before anything else: nothing is sent, and a human
    # is told why.
    assert run.status == Run.Status.NEEDS_ATTENTION and "used before with other arguments" in run.status_reason
    assert ToolOperation.objects.get(approval=request).status != ToolOperation.Status.COMMITTED
    assert emails() == 0
