"""The gate's verdict, call by call: the strictest of everything that matches, on each point; what can
raise it and what cannot lower it (docs/access.md); and no operation without one."""

import re
from pathlib import Path

import pytest
from django.db import IntegrityError, transaction

from agents.models import Workflow
from api.tools import TOOL_CLASS
from policy.models import ApprovalPolicy
from runs.services import run_start
from tenancy.access import default_project
from tenancy.models import Project
from tests.conftest import ROOT
from tests.runs.test_engine import scripted_workflow
from tools.classifications import tool_classification_set
from tools.gate import ALLOW, APPROVAL, REFUSE, Origin, Verdict, gate, strictest, tool_classify
from tools.models import ToolClassification, ToolOperation

MAIL = {"to": "a@customer.example", "subject": "Refund", "body": "Done."}


@pytest.fixture
def run(demo):
    scripted_workflow("gated", [{"final": {}}], tools=["email.send", "tickets.create", "crm.read"])
    return run_start(workflow="gated")


def judge(run, tool="email.send", arguments=MAIL, origin=Origin.AGENT, **extra) -> Verdict:
    return gate(run_id=run.id, tool=tool, arguments=arguments, origin=origin, **extra)


def test_with_nothing_matching_a_registered_write_is_allowed(run):
    verdict = judge(run)
    assert (verdict.decision, verdict.classified_by, verdict.tool_class) == (ALLOW, "registry", "non_idempotent_write")


def test_the_strictest_of_several_policies_applies_on_each_point(run):
    ApprovalPolicy.objects.create(name="a", tool="email.send", quorum=2, expires_after_seconds=600)
    ApprovalPolicy.objects.create(name="b", project=default_project(), decided_by_role="admin")  # every write
    ApprovalPolicy.objects.create(name="c", tool="email.send", on_reject="fail_task", expires_after_seconds=60)
    ApprovalPolicy.objects.create(name="off", tool="email.send", quorum=5, enabled=False)
    ApprovalPolicy.objects.create(name="elsewhere", project=Project.objects.create(slug="x", name="x"), quorum=4)
    verdict = judge(run)
    assert verdict.decision == APPROVAL
    assert (verdict.quorum, verdict.admins_only, verdict.fail_on_reject, verdict.expires_after) == (2, True, True, 60)
    assert len(verdict.policies) == 3 and "policy" in verdict.summary()


def test_a_policy_for_every_tool_covers_writes_and_a_named_one_covers_a_read(run):
    ApprovalPolicy.objects.create(name="all writes")
    assert judge(run, "crm.read", {"customer_id": "c"}).decision == ALLOW
    ApprovalPolicy.objects.create(name="reads too", tool="crm.read")
    assert judge(run, "crm.read", {"customer_id": "c"}).decision == APPROVAL


def test_a_read_claimed_as_a_write_meets_the_policies_for_every_write(run):
    """A caller's claim may raise a read to a write; the policies for every write then apply to it."""
    ApprovalPolicy.objects.create(name="all writes", quorum=2)
    verdict = judge(run, "crm.read", {"customer_id": "c"}, claimed_class="non_idempotent_write")
    assert (verdict.decision, verdict.tool_class, verdict.quorum) == (APPROVAL, "non_idempotent_write", 2)


def test_the_workflows_trusted_policy_and_propose_mode_raise_it(run):
    assert judge(run, origin=Origin.PROPOSAL).decision == APPROVAL  # the run's input asked for a person
    Workflow.objects.filter(slug="gated").update(
        tool_policies={"email.send": {"approval": "always", "quorum": 3, "admins_only": True}}
    )
    verdict = judge(run_start(workflow="gated"))  # a run keeps its start's policies: a new one has these
    assert (verdict.decision, verdict.quorum, verdict.admins_only) == (APPROVAL, 3, True)


def test_a_correction_waits_unless_the_workflow_says_it_need_not(run):
    assert judge(run, origin=Origin.CORRECTION, corrects="email.send").decision == APPROVAL
    Workflow.objects.filter(slug="gated").update(tool_policies={"email.send": {"correction_approval": "never"}})
    run = run_start(workflow="gated")
    assert judge(run, origin=Origin.CORRECTION, corrects="email.send").decision == ALLOW
    assert judge(run, "tickets.close", {"ticket_id": "T-1"}, origin=Origin.COMPENSATION).decision == ALLOW


def test_a_tool_outside_the_allowlist_is_refused(run):
    assert judge(run, allowed_tools=["crm.read"]).decision == REFUSE


def test_an_unclassified_tool_is_the_most_dangerous_class_whatever_is_claimed(run):
    verdict = judge(run, "payments.refund", {"charge": "c"}, origin=Origin.EXTERNAL, claimed_class="read_only")
    assert (verdict.decision, verdict.classified_by) == (APPROVAL, "unclassified")
    assert (verdict.tool_class, verdict.reversibility) == ("non_idempotent_write", "irreversible")


def test_a_project_classification_sets_the_class_and_a_claim_only_raises_it(run, operator):
    project = default_project()
    tool_classification_set(user=operator, project=project, tool="crm.note", tool_class="read_only")
    assert judge(run, "crm.note", {}, origin=Origin.EXTERNAL).decision == ALLOW
    claimed = tool_classify(project_id=project.id, tool="crm.note", claimed_class="idempotent_write")
    assert (claimed.tool_class, claimed.reversibility) == ("idempotent_write", "irreversible")
    lowered = tool_classify(project_id=project.id, tool="email.send", claimed_class="read_only")
    assert (lowered.tool_class, lowered.reversibility) == ("non_idempotent_write", "irreversible")
    tool_classification_set(user=operator, project=project, tool="crm.note", tool_class="read_only", approval="refuse")
    assert judge(run, "crm.note", {}, origin=Origin.EXTERNAL).decision == REFUSE


def test_a_classification_needs_a_project_admin_and_sane_values(run, django_user_model):
    from core.errors import Forbidden, InvalidInput
    from tenancy.access import membership_grant

    rita = django_user_model.objects.create_user(username="rita", password="rita-pass-123")
    membership_grant(user=rita, project=default_project(), role="reviewer")
    with pytest.raises(Forbidden):
        tool_classification_set(user=rita, project=default_project(), tool="crm.note", tool_class="read_only")
    admin = django_user_model.objects.create_superuser(username="root", password="root-pass-123", email="r@x.y")
    for bad in (
        {"tool": "email.send", "tool_class": "read_only"},  # the registry says what its tools do
        {"tool": "crm.note", "tool_class": "read_only", "reversibility": "irreversible"},
        {"tool": "crm.note", "tool_class": "idempotent_write"},  # a write is reversible or not
        {"tool": "no spaces", "tool_class": "read_only"},
    ):
        with pytest.raises(InvalidInput):
            tool_classification_set(user=admin, project=default_project(), **bad)
    assert not ToolClassification.objects.exists()


def test_strictest_combines_verdicts_point_by_point():
    base = {"tool_class": "idempotent_write", "reversibility": "reversible", "classified_by": "registry"}
    one = Verdict(APPROVAL, **base, quorum=1, expires_after=300, policies=(1,), reasons=("a",))
    two = Verdict(APPROVAL, **base, quorum=2, admins_only=True, expires_after=900, policies=(2,), reasons=("b",))
    free = Verdict(ALLOW, **{**base, "reversibility": "irreversible"}, reasons=("c",))
    both = strictest([one, two, free])
    assert (both.decision, both.quorum, both.admins_only, both.expires_after) == (APPROVAL, 2, True, 300)
    assert (both.policies, both.reversibility, both.reasons) == ((1, 2), "irreversible", ("a", "b", "c"))
    assert Verdict.from_json(both.to_json()) == both
    assert Verdict.from_json({}).decision == APPROVAL  # a verdict that cannot be read is the stricter one


def test_the_database_refuses_an_operation_without_a_verdict(run):
    with pytest.raises(IntegrityError), transaction.atomic():
        ToolOperation.objects.create(
            run=run,
            tool="email.send",
            idempotency_key="k",
            arguments_hash="h",
            tool_class="read_only",
            status="executing",
        )


def test_only_the_ledger_writes_operations():
    """Every code path that writes an operation goes through tools.ledger.operation_record (which stores
    the verdict): no other module of the product creates ToolOperation rows."""
    writes = re.compile(r"ToolOperation(\.objects\.(create|bulk_create|get_or_create|update_or_create)|\()")
    offenders = [
        str(path.relative_to(ROOT))
        for app in ("runs", "agents", "tools", "approvals", "config")
        for path in (ROOT / app).rglob("*.py")
        if "migrations" not in path.parts and writes.search(path.read_text()) and path.name != "ledger.py"
    ]
    assert offenders == [] or offenders == ["tools/models.py"], offenders
    assert "class ToolOperation(" in Path(ROOT / "tools/models.py").read_text()


def test_the_api_example_of_a_classification_is_valid(run, operator):
    body = {k: v for k, v in TOOL_CLASS.items() if k != "project"}
    row = tool_classification_set(user=operator, project=default_project(), **body)
    assert (row.tool, row.approval) == ("payments.refund", "always")
