"""The refunds example (examples/refunds/README.md) as a new user runs it: the payments service and the
ticketing MCP server on this machine, the tools declared by its setup script, one refund held for a
reviewer and made once after the yes."""

import json
import uuid
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from examples.refunds.payments_service import PaymentsService
from examples.refunds.setup_refunds import SetupFailed, refunds_setup
from policy.models import ApprovalRequest
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


WARDEN_YAML = Path(__file__).resolve().parents[2] / "examples" / "refunds" / "warden.yaml"


def declared_from_its_file(tmp_path, payments_url: str, django_user_model) -> None:
    """examples/refunds/warden.yaml, with this machine's service address and the test's MCP command,
    applied by a superuser, then again by a project admin: the second time nothing changes."""
    text = WARDEN_YAML.read_text().replace("http://127.0.0.1:8701", payments_url)
    path = tmp_path / "warden.yaml"
    path.write_text(text.replace("command: refunds-tickets", "command: tickets"))
    django_user_model.objects.create_user(username="root", password="root-pass-123", is_superuser=True)
    out = StringIO()
    call_command("warden_apply", str(path), "--as", "root", "--json", stdout=out)
    assert {item["status"] for item in json.loads(out.getvalue())["items"]} == {"created"}
    admin = django_user_model.objects.create_user(username="ada", password="ada-pass-123")
    membership_grant(user=admin, project=default_project(), role="admin")
    out = StringIO()
    call_command("warden_apply", str(path), "--as", "ada", stdout=out)
    assert "0 created, 0 changed, 9 unchanged, 0 pending" in out.getvalue()


@pytest.mark.parametrize("declared", ["by its setup script", "by its warden.yaml"])
def test_the_refunds_example_holds_the_refund_for_a_reviewer_then_makes_it_once(
    demo_tx, worker, services, django_user_model, declared, tmp_path
):
    payments, tickets = services
    if declared == "by its warden.yaml":
        declared_from_its_file(tmp_path, payments.url, django_user_model)
    else:
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
