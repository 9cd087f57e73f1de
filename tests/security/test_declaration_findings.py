"""Issue 25's findings about what a declared tool is, tried again as they were found: through the admin, the
API and runs against a real HTTP service on 127.0.0.1. Each must now fail, and change nothing.

6. A declaration set its own class: a POST declared read_only went out under a superuser's global "every
   write waits" policy. (MCP annotations: tests/tools/test_mcp_tools.py; the tool-classes API:
   tests/tools/test_tool_classes_api.py.)
7. An approval bound the tool's name and arguments, not what the tool is: after a reviewer approved a
   call, its tool's URL changed and the approved call went to the new target with no new approval.
8. Irreversible actions left unreviewed unless a policy named them.
"""

import pytest

from examples.refunds.payments_service import PaymentsService
from policy.models import ApprovalPolicy, ApprovalRequest
from runs.models import Run
from runs.services import run_start
from tenancy.access import default_project, membership_grant
from tenancy.models import Project
from tests.conftest import decide, wait_for
from tests.runs.test_engine import finished
from tests.tools.test_http_tools import CANARY, REFUND_SCHEMA, admin_form, refund_run
from tools.models import HttpTool, ToolOperation

OS = ToolOperation.Status


@pytest.fixture
def two_services(monkeypatch, settings):
    """The payments service the tool was declared for, and another one an admin points it at later."""
    monkeypatch.setenv("PAYMENTS_API_KEY", CANARY)
    settings.WARDEN = {**settings.WARDEN, "SECRET_GRANTS": {"PAYMENTS_API_KEY": ["default"]}}
    first, second = PaymentsService(api_key=CANARY).start(), PaymentsService(api_key=CANARY).start()
    yield first, second
    first.stop()
    second.stop()


@pytest.fixture
def reviewer(django_user_model):
    rita = django_user_model.objects.create_user(username="rita", password="rita-pass-123")
    membership_grant(user=rita, project=default_project(), role="reviewer")
    return rita


def refund_tool(service, project=None, **fields) -> HttpTool:
    """Written straight to the table, as a row that got past the admin's checks would be."""
    values = {"project": project or default_project(), "name": "payments.refund", "method": "POST",
              "url": service.url + "/v1/charges/{charge_id}/refunds", "arguments_schema": REFUND_SCHEMA,
              "tool_class": "non_idempotent_write", "reversibility": "irreversible",
              "headers": {"Authorization": "Bearer {secret:PAYMENTS_API_KEY}"},
              "idempotency_header": "Idempotency-Key", **fields}  # fmt: skip
    return HttpTool.objects.create(**values)


def test_a_post_declared_as_a_read_is_refused_in_the_admin(admin_client, two_services):
    ApprovalPolicy.objects.create(name="every write waits", tool="")  # a superuser's, for every project
    data = {**admin_form(two_services[0]), "tool_class": "read_only", "reversibility": "", "idempotency_header": ""}
    response = admin_client.post("/admin/tools/httptool/add/", data)
    assert (
        response.status_code == 200 and "a POST request is at least a non idempotent write" in response.content.decode()
    )
    assert not HttpTool.objects.exists()


def test_a_post_stored_as_a_read_still_waits_under_every_write_waits(demo_tx, worker, two_services):
    service = two_services[0]
    ApprovalPolicy.objects.create(name="every write waits", tool="")
    refund_tool(service, tool_class="read_only", reversibility="")
    run = run_start(workflow=refund_run("stored-as-read").slug)
    wait_for(lambda: ApprovalRequest.objects.filter(run=run).exists(), message="the POST to wait for a reviewer")
    op = ToolOperation.objects.get(run=run)
    assert op.tool_class == "non_idempotent_write" and op.status == OS.AWAITING_APPROVAL
    assert any("every write waits" in reason for reason in op.verdict["reasons"])
    assert service.requests == []


def test_an_approval_does_not_carry_over_to_a_changed_declaration(demo_tx, worker, two_services, reviewer):
    old, new = two_services
    tool = refund_tool(old)
    ApprovalPolicy.objects.create(name="refunds wait", tool="payments.refund")  # as when it was found
    run = run_start(workflow=refund_run("moved").slug)
    wait_for(lambda: ApprovalRequest.objects.filter(run=run).exists(), message="the refund's approval request")
    first = ApprovalRequest.objects.get(run=run)
    # The declaration changes while the call waits (a superuser's change, or an approved change request).
    tool.url = new.url + "/v1/charges/{charge_id}/refunds"
    tool.save()
    decide(request_id=first.id, user=reviewer, approve=True)
    wait_for(lambda: ApprovalRequest.objects.filter(run=run, status="pending").exists(), message="a new request")
    assert old.requests == [] and new.requests == []  # the approved call did not leave for the new target
    op = ToolOperation.objects.get(run=run)
    assert op.status == OS.AWAITING_APPROVAL and "declaration changed" in op.status_reason
    second = ApprovalRequest.objects.get(run=run, status="pending")
    assert second.id != first.id and second.declaration == op.declaration != first.declaration
    decide(request_id=second.id, user=reviewer, approve=True)
    run = finished(run)
    assert run.status == Run.Status.COMPLETED, run.status_reason
    assert [e["effect"] for e in new.effects] == ["refund"] and old.effects == []


def test_an_irreversible_write_waits_by_default_and_a_waiver_is_the_projects_word(demo_tx, worker, two_services):
    service = two_services[0]
    refund_tool(service)
    run = run_start(workflow=refund_run("default").slug)
    wait_for(lambda: ApprovalRequest.objects.filter(run=run).exists(), message="the irreversible call to wait")
    op = ToolOperation.objects.get(run=run)
    assert op.status == OS.AWAITING_APPROVAL and service.requests == []
    assert any("irreversible: it waits for a reviewer" in r for r in op.verdict["reasons"])

    # Another project's waiver waives nothing here; this project's does.
    other = Project.objects.create(slug="elsewhere", name="Elsewhere")
    ApprovalPolicy.objects.create(name="theirs", effect="waive", project=other, tool="payments.refund")
    run = run_start(workflow=refund_run("not-theirs").slug)
    wait_for(lambda: ApprovalRequest.objects.filter(run=run).exists(), message="another project's waiver to not count")
    waiver = ApprovalPolicy.objects.create(name="ours", effect="waive", project=default_project(),
                                           tool="payments.refund")  # fmt: skip
    run = finished(run_start(workflow=refund_run("waived").slug))
    assert run.status == Run.Status.COMPLETED, run.status_reason
    op = ToolOperation.objects.get(run=run)
    assert op.verdict["waiver"] == waiver.id and op.approval_id is None
    assert [e["effect"] for e in service.effects] == ["refund"]


def test_a_waiver_with_a_condition_it_cannot_evaluate_waives_nothing(demo_tx, worker, two_services):
    refund_tool(two_services[0])
    condition = {"field": "amount_cents", "op": "<", "value": "x"}  # an int compared with text
    ApprovalPolicy.objects.create(
        name="small refunds", effect="waive", project=default_project(), tool="payments.refund", condition=condition
    )
    run = run_start(workflow=refund_run("odd-condition").slug)
    wait_for(lambda: ApprovalRequest.objects.filter(run=run).exists(), message="the call to wait")
    assert two_services[0].requests == []
