"""The refunds example (examples/refunds/README.md) as a new user runs it: the payments service and the
ticketing MCP server on this machine, the tools declared by its setup script, one refund held for a
reviewer and made once after the yes."""

import json
import uuid

import pytest

from approvals.models import ApprovalRequest
from examples.refunds.payments_service import PaymentsService
from examples.refunds.setup_refunds import SetupFailed, refunds_setup
from runs.models import Run
from runs.services import run_start
from tenancy.access import default_project, membership_grant
from tests.conftest import decide, wait_for
from tests.runs.test_engine import finished
from tools.models import ToolOperation


@pytest.fixture
def services(monkeypatch, tmp_path, settings):
    key = f"demo-{uuid.uuid4().hex}"
    monkeypatch.setenv("PAYMENTS_API_KEY", key)
    # As the README's step 2 says: the deployment grants the key to the default project.
    settings.WARDEN = {**settings.WARDEN, "SECRET_GRANTS": {"PAYMENTS_API_KEY": ["default"]}}
    monkeypatch.setenv("TICKETS_EFFECTS", str(tmp_path / "tickets.jsonl"))
    payments = PaymentsService(api_key=key).start()
    yield payments, tmp_path / "tickets.jsonl"
    payments.stop()


def test_the_refunds_example_holds_the_refund_for_a_reviewer_then_makes_it_once(
    demo_tx, worker, services, django_user_model
):
    payments, tickets = services
    refunds_setup(payments_url=payments.url, mcp_command="tickets")
    refunds_setup(payments_url=payments.url, mcp_command="tickets")  # run again: it updates, nothing doubles
    reviewer = django_user_model.objects.create_user(username="rita", password="x-pass-123456")
    membership_grant(user=reviewer, project=default_project(), role="reviewer")

    run = run_start(workflow="refund-request", input={"charge_id": "ch_1001", "why": "arrived broken"})
    wait_for(lambda: ApprovalRequest.objects.filter(run=run).exists(), timeout=60, message="the refund's request")
    assert payments.effects == []  # read and ticket done, the refund waits
    assert [json.loads(line)["effect"] for line in tickets.read_text().splitlines()] == ["create"]
    decide(request_id=ApprovalRequest.objects.get(run=run).id, user=reviewer, approve=True)
    run = finished(run, timeout=60)
    assert run.status == Run.Status.COMPLETED, run.status_reason
    [refund] = payments.effects
    assert refund["charge_id"] == "ch_1001" and refund["amount_cents"] == 2500
    tools = list(ToolOperation.objects.filter(run=run).order_by("step").values_list("tool", "status"))
    assert tools == [
        ("payments.get_charge", "committed"),
        ("helpdesk.create_ticket", "committed"),
        ("payments.refund", "committed"),
    ]


def test_the_setup_stops_with_the_reason_when_the_host_is_not_allowed(db, services, settings):
    settings.WARDEN = {**settings.WARDEN, "HTTP_TOOL_HOSTS": ["payments.internal"]}
    with pytest.raises(SetupFailed, match="host must be one this deployment allows"):
        refunds_setup(payments_url=services[0].url, mcp_command="tickets")
