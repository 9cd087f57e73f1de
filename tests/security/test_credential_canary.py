"""A tool's credential, for every kind of tool (a team's Python tool, an HTTP tool, an MCP server's tool,
the sandbox tracker), is named, read by the broker at call time and handed to the system alone: the
system gets it (it checks it), and no stored row, log record, API answer, page or webhook holds it, even
when the system quotes it back in an error. A model never supplies or sees it."""

import json
import logging
import uuid

import pytest
from django.apps import apps

from examples.refunds.payments_service import PaymentsService
from integrations.models import WebhookEndpoint
from runs.models import Run
from runs.services import run_start
from tenancy.access import default_project
from tenancy.tokens import api_token_create
from tests.conftest import wait_for
from tests.runs.test_engine import finished, scripted_workflow
from tests.tools.test_http_tools import declare, waive
from tests.tools.test_mcp_tools import effects
from tools.mcp_tools import mcp_list, mcp_tools_store
from tools.models import McpServer, SandboxCall, ToolClassification
from tools.registry import REDACTED, TOOLS, tools_load

CANARY = f"canary-credential-{uuid.uuid4().hex}"


class Kind:
    """How one kind of tool is set up with the canary as its credential, the call that succeeds, the
    call whose system quotes the credential back, and how the test knows the system got it."""

    def __init__(self, name, monkeypatch, tmp_path, settings):
        self.name, self.tmp = name, tmp_path
        # HTTP tools and MCP servers name only secrets granted to their project (docs/tools.md, "Secrets").
        settings.WARDEN = {**settings.WARDEN, "SECRET_GRANTS": {"PAYMENTS_API_KEY": ["default"],
                                                                "TICKETS_TOKEN": ["default"]}}  # fmt: skip
        getattr(self, f"_{name}")(monkeypatch)

    def _python(self, monkeypatch):
        monkeypatch.setenv("TEAM_PAYMENTS_KEY", CANARY)
        monkeypatch.setenv("TEAM_PAYMENTS_EXPECTED_KEY", CANARY)  # the service refuses any other key
        monkeypatch.setenv("TEAM_PAYMENTS_FILE", str(self.tmp / "payments.jsonl"))
        self.before = dict(TOOLS)
        tools_load(["tools.sandbox_tools", "tests.tools.team_tools"])
        self.tool = "payments.hold"
        self.ok = {"card": "card_4242", "amount_cents": 100}
        self.quoting = {"card": "card_quote", "amount_cents": 100}
        self.received = lambda: (self.tmp / "payments.jsonl").exists()

    def _http(self, monkeypatch):
        monkeypatch.setenv("PAYMENTS_API_KEY", CANARY)
        self.service = PaymentsService(api_key=CANARY).start()  # answers 401 to any other key
        declare(self.service)
        waive("payments.refund")  # irreversible: the project says it leaves unattended
        self.tool = "payments.refund"
        self.ok = {"charge_id": "ch_1001", "amount_cents": 100, "reason": "echo"}  # it echoes the key back
        self.quoting = {"charge_id": "ch_1002", "amount_cents": 100, "reason": "quote"}
        self.received = lambda: any(e["effect"] == "refund" for e in self.service.effects)

    def _mcp(self, monkeypatch):
        monkeypatch.setenv("TICKETS_TOKEN", CANARY)
        monkeypatch.setenv("TICKETS_EFFECTS", str(self.tmp / "tickets.jsonl"))
        server = McpServer.objects.create(project=default_project(), name="helpdesk", transport="stdio",
                                          command="tickets", secrets=["TICKETS_TOKEN"], timeout_seconds=20)  # fmt: skip
        mcp_tools_store(server, mcp_list(server))
        # Classified by the project (unannotated, it would wait for a reviewer first).
        ToolClassification.objects.create(project=default_project(), tool="helpdesk.create_ticket",
                                          tool_class="non_idempotent_write", reversibility="irreversible")  # fmt: skip
        waive("helpdesk.create_ticket")
        self.tool = "helpdesk.create_ticket"
        self.ok = {"title": "Refund for order 1001"}
        self.quoting = {"title": "quote"}
        self.received = lambda: [e["authorised"] for e in effects(self.tmp / "tickets.jsonl")] == [True]

    def _sandbox(self, monkeypatch):
        monkeypatch.setenv("SANDBOX_TICKETS_API_KEY", CANARY)  # the tracker refuses a call without one
        self.tool = "tickets.create"
        self.ok = {"customer_id": "c1", "title": "Incident"}
        self.quoting = None
        self.received = lambda: SandboxCall.objects.filter(tool="tickets.create", is_effect=True).exists()

    def stop(self):
        if self.name == "http":
            self.service.stop()
        if self.name == "python":
            TOOLS.clear()
            TOOLS.update(self.before)


@pytest.fixture
def logs(caplog):
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="warden")
    return caplog


def _run(kind: Kind, arguments: dict) -> Run:
    wf = scripted_workflow(
        f"canary-{kind.name}-{uuid.uuid4().hex[:6]}",
        [{"tool": kind.tool, "arguments": arguments}, {"final": {"answer": "{last}"}}],
        tools=[kind.tool],
    )
    return finished(run_start(workflow=wf.slug), timeout=60)


@pytest.mark.parametrize("name", ["python", "http", "mcp", "sandbox"])
def test_a_named_credential_reaches_its_system_and_nothing_else(
    name, demo_tx, worker, monkeypatch, tmp_path, logs, client, django_user_model, webhook_receiver, settings
):
    WebhookEndpoint.objects.create(url=webhook_receiver.url, secret="whsec-canary")
    kind = Kind(name, monkeypatch, tmp_path, settings)
    try:
        ok = _run(kind, kind.ok)
        assert ok.status == Run.Status.COMPLETED, ok.status_reason
        assert kind.received(), "the system did not get its credential"
        runs = [ok]
        if kind.quoting is not None:
            quoted = _run(kind, kind.quoting)
            assert quoted.status == Run.Status.NEEDS_ATTENTION
            assert REDACTED in quoted.status_reason, quoted.status_reason  # the system did quote it
            runs.append(quoted)
    finally:
        kind.stop()
    wait_for(lambda: len(webhook_receiver.received) >= len(runs), message="the runs' webhooks")

    leaks = [f"table {m._meta.label}" for m in apps.get_models() if CANARY in _rows(m)]
    assert logs.records, "no log records were captured: the check would prove nothing"
    if CANARY in logs.text or any(CANARY in repr(r.__dict__) for r in logs.records):
        leaks.append("logs")
    leaks += [f"webhook {r['body'][:80]!r}" for r in webhook_receiver.received if CANARY in str(r["body"])]
    root = django_user_model.objects.create_superuser(username="root", password="root-pass-123", email="r@x.y")
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {api_token_create(user=root)[1]}"}
    client.force_login(root)
    for run in runs:
        for url in [f"/api/v1/runs/{run.id}", f"/api/v1/runs/{run.id}/operations", "/api/v1/sandbox/effects"]:
            answer = client.get(url, **bearer)
            assert answer.status_code == 200, url
            leaks += [f"API {url}"] if CANARY in answer.content.decode() else []
        for url in [f"/runs/{run.id}/", "/admin/tools/tooloperation/", "/admin/runs/span/", "/admin/tools/httptool/",
                    "/admin/tools/mcpserver/", "/admin/tools/sandboxcall/"]:  # fmt: skip
            page = client.get(url)
            assert page.status_code == 200, url
            leaks += [f"page {url}"] if CANARY in page.content.decode() else []
    assert not leaks, f"the credential leaked to: {leaks}"


def _rows(model) -> str:
    return json.dumps(list(model._default_manager.values()), default=str)
