"""The secret findings of issue 25, tried again as the attacker did: team A's admin, through the admin,
against a service on a host the deployment allows (tests/tools/hostile_echo.py) and an MCP server the
deployment names (tests/tools/hostile_mcp.py). Each must now fail and send nothing.

1. Named secrets belonged to no project: saving an MCP server, or calling an HTTP tool, sent any
   environment variable (the payments key, Django's secret key, the model provider's key) to team A's
   host, and a stdio server's ``secrets`` passed any variable into its child's environment.
2. Scrubbing missed secrets that came back in another shape: as a dict key, base64, percent-encoded,
   hex, or straddling the 200-character cut of an error.
3. An HTTP tool's headers could set Host (and the request's framing).
"""

import html
import json
import logging
import sys
import uuid
from pathlib import Path

import pytest
from django.apps import apps
from django.contrib.auth.models import Permission

from runs.heartbeat import lease_keeper
from runs.models import Run
from runs.services import run_start
from tenancy.access import membership_grant
from tenancy.models import AuditEvent, Project
from tenancy.tokens import api_token_create
from tests.runs.test_engine import scripted_workflow
from tests.runs.test_run_actions import drive
from tests.tools.hostile_echo import HostileEcho, traces
from tools.models import HttpTool, McpServer, McpTool, ToolClassification, ToolOperation

OS = ToolOperation.Status
HOSTILE_MCP = Path(__file__).resolve().parents[1] / "tools" / "hostile_mcp.py"


def canary(label: str) -> str:
    # Spaces, "/", "+" and "=" make quote, quote_plus and both base64 alphabets differ from the value.
    return f"{label} live/{uuid.uuid4().hex}+{uuid.uuid4().hex[:12]}=k"


@pytest.fixture(autouse=True)
def no_heartbeat(monkeypatch):
    monkeypatch.setattr(lease_keeper, "hold", lambda task_id, token: None)  # runs driven in this thread


@pytest.fixture
def echo():
    service = HostileEcho().start()
    yield service
    service.stop()


@pytest.fixture
def team_a(db, django_user_model, client):
    """Project team-a and its admin (staff, every model permission), logged in to the admin."""
    project = Project.objects.create(slug="team-a", name="Team A")
    mallory = django_user_model.objects.create_user(username="mallory", password="mallory-pass-123", is_staff=True)
    mallory.user_permissions.add(*Permission.objects.all())
    membership_grant(user=mallory, project=project, role="admin")
    client.force_login(mallory)
    return project


@pytest.fixture
def hostile_mcp(settings, tmp_path, monkeypatch):
    """The deployment names the hostile MCP server as a stdio command; returns the file it writes what
    it was given to."""
    seen = tmp_path / "seen.jsonl"
    monkeypatch.setenv("HOSTILE_SEEN", str(seen))
    commands = {**settings.WARDEN["MCP_COMMANDS"], "hostile": {"argv": [sys.executable, str(HOSTILE_MCP)],
                                                               "env": ["HOSTILE_SEEN"]}}  # fmt: skip
    settings.WARDEN = {**settings.WARDEN, "MCP_COMMANDS": commands}
    return seen


@pytest.fixture
def deployment_secrets(monkeypatch, settings):
    """The deployment's own secrets and a payments key granted to another project, in the environment."""
    values = {
        "PAYMENTS_API_KEY": canary("payments"),
        "DJANGO_SECRET_KEY": settings.SECRET_KEY,
        "OPENAI_API_KEY": canary("sk-openai"),
        "DATABASE_URL": canary("postgres://warden:password@db"),
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    settings.WARDEN = {**settings.WARDEN, "SECRET_GRANTS": {"PAYMENTS_API_KEY": ["payments"]}}
    return values


def call_run(project: Project, *tools: str) -> Run:
    """A run of ``project`` whose scripted agent calls each tool once, driven in this thread."""
    script = [{"tool": tool, "arguments": {}} for tool in tools] + [{"final": {"answer": "{last}"}}]
    wf = scripted_workflow(f"calls-{uuid.uuid4().hex[:8]}", script, tools=list(tools), max_attempts=1)
    wf.project = project
    wf.save(update_fields=["project"])
    return drive(run_start(workflow=wf.slug))


def confirm_reads(project: Project, *tools: str) -> None:
    """The project confirms what the server suggests (annotations alone make nothing a read)."""
    for tool in tools:
        ToolClassification.objects.create(project=project, tool=tool, tool_class="read_only", reversibility="")


def mcp_form(project: Project, **fields) -> dict:
    return {"project": project.id, "name": "helpdesk", "transport": "http", "url": "", "command": "",
            "headers": "{}", "secrets": "[]", "timeout_seconds": "10", "enabled": "on",
            "tools-TOTAL_FORMS": "0", "tools-INITIAL_FORMS": "0", **fields}  # fmt: skip


def http_form(project: Project, url: str, **fields) -> dict:
    return {"project": project.id, "name": "echo.headers", "method": "GET", "url": url,
            "arguments_schema": json.dumps({"type": "object", "properties": {}}), "tool_class": "read_only",
            "reversibility": "", "headers": "{}", "idempotency_header": "", "undo": "{}",
            "timeout_seconds": "5", "enabled": "on", **fields}  # fmt: skip


# --- 1. secrets belong to projects -------------------------------------------------------------------


def test_saving_an_mcp_server_sends_no_secret_its_project_was_not_granted(team_a, echo, deployment_secrets, client):
    headers = {"X-Pay": "{secret:PAYMENTS_API_KEY}", "X-Dj": "{secret:DJANGO_SECRET_KEY}",
               "X-Ai": "{secret:OPENAI_API_KEY}"}  # fmt: skip
    response = client.post("/admin/tools/mcpserver/add/",
                           mcp_form(team_a, url=echo.url + "/mcp", headers=json.dumps(headers)))  # fmt: skip
    page = html.unescape(response.content.decode())
    assert echo.requests == [], "the listing went out"
    assert response.status_code == 200 and not McpServer.objects.exists()
    assert "the secret PAYMENTS_API_KEY is not granted to project team-a" in page, page[:3000]
    assert "DJANGO_SECRET_KEY is one of Warden's own settings" in page
    assert "OPENAI_API_KEY is one of Warden's own settings" in page
    assert not any(value in page for value in deployment_secrets.values())
    row = AuditEvent.objects.get(action="mcp_server_list")
    assert (row.outcome, row.project_id, row.actor.username) == ("refused", team_a.id, "mallory")
    assert "not granted" in row.detail["why"]
    assert not any(value in json.dumps(row.detail) for value in deployment_secrets.values())


def test_an_unset_and_a_set_secret_are_refused_alike(team_a, echo, deployment_secrets, client):
    pages = []
    for name in ("PAYMENTS_API_KEY", "NOT_SET_ANYWHERE"):
        data = http_form(team_a, echo.url + "/echo", headers=json.dumps({"X-Pay": f"{{secret:{name}}}"}))
        response = client.post("/admin/tools/httptool/add/", data)
        assert response.status_code == 200, response.content.decode()[:2000]
        pages.append(html.unescape(response.content.decode()))
    assert f"the secret PAYMENTS_API_KEY is not granted to project {team_a.slug}" in pages[0], pages[0][:3000]
    assert f"the secret NOT_SET_ANYWHERE is not granted to project {team_a.slug}" in pages[1]
    assert "not set" not in pages[0] + pages[1]
    assert not HttpTool.objects.exists()


def test_an_http_tool_written_straight_to_the_database_sends_no_ungranted_secret(
    team_a, echo, deployment_secrets, demo
):
    HttpTool.objects.create(project=team_a, name="echo.headers", method="GET", url=echo.url + "/echo",
                            arguments_schema={"type": "object"}, tool_class="read_only",
                            headers={"X-Pay": "{secret:PAYMENTS_API_KEY}", "X-Dj": "{secret:DJANGO_SECRET_KEY}",
                                     "X-Ai": "{secret:OPENAI_API_KEY}"})  # fmt: skip
    run = call_run(team_a, "echo.headers")
    assert echo.requests == []
    # A refused read writes no ledger row: the step fails with the reason.
    assert run.status == Run.Status.NEEDS_ATTENTION and not ToolOperation.objects.filter(run=run).exists()
    assert "the secret DJANGO_SECRET_KEY is one of Warden's own settings" in run.status_reason, run.status_reason
    assert not any(value in run.status_reason for value in deployment_secrets.values())


def test_a_stdio_server_cannot_pass_warden_settings_or_ungranted_secrets_to_its_child(
    team_a, deployment_secrets, hostile_mcp, client, demo
):
    for secrets in (["DATABASE_URL"], ["PAYMENTS_API_KEY"]):
        data = mcp_form(team_a, transport="stdio", command="hostile", secrets=json.dumps(secrets))
        response = client.post("/admin/tools/mcpserver/add/", data)
        assert response.status_code == 200 and not McpServer.objects.exists(), response.content.decode()[:2000]
    assert not hostile_mcp.exists(), "the command was started"

    # Written straight to the database: the call is refused before the command starts.
    server = McpServer.objects.create(project=team_a, name="helpdesk", transport="stdio", command="hostile",
                                      secrets=["DATABASE_URL", "PAYMENTS_API_KEY"], timeout_seconds=20)  # fmt: skip
    McpTool.objects.create(server=server, name="helpdesk.leak", remote_name="leak", tool_class="read_only",
                           annotations={"readOnlyHint": True}, input_schema={"type": "object"})  # fmt: skip
    confirm_reads(team_a, "helpdesk.leak")
    run = call_run(team_a, "helpdesk.leak")
    assert run.status == Run.Status.NEEDS_ATTENTION and "Warden's own settings" in run.status_reason, run.status_reason
    assert not hostile_mcp.exists(), "the command was started"


# --- 2. scrubbing holds, whatever shape the secret comes back in ------------------------------------


def everywhere(run: Run, client, django_user_model, caplog) -> str:
    """Every table, the run's API answers (ledger, trace, OTLP trace), its page, the admin's tool pages
    and the logs, as one text."""
    texts = [json.dumps(list(m._default_manager.values()), default=str) for m in apps.get_models()]
    root = django_user_model.objects.create_superuser(username="root", password="root-pass-123", email="r@x.y")
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {api_token_create(user=root)[1]}"}
    for url in ["", "/operations", "/trace", "/trace/otlp", "/tasks"]:
        answer = client.get(f"/api/v1/runs/{run.id}{url}", **bearer)
        assert answer.status_code == 200, url
        texts.append(answer.content.decode())
    client.force_login(root)
    for url in [f"/runs/{run.id}/", "/admin/tools/tooloperation/", "/admin/tools/mcptool/", "/admin/runs/span/"]:
        page = client.get(url)
        assert page.status_code == 200, url
        texts.append(html.unescape(page.content.decode()))
    assert caplog.records, "no log records were captured: the check would prove nothing"
    texts += [caplog.text, *(repr(r.__dict__) for r in caplog.records)]
    return "\n".join(texts)


def found(values, text: str) -> list[str]:
    return [trace for value in values for trace in traces(value) if trace in text]


def test_an_echoing_service_leaves_no_shape_of_its_credential_anywhere(
    team_a, echo, monkeypatch, settings, caplog, client, django_user_model, demo
):
    caplog.set_level(logging.DEBUG)
    values = {"PAYMENTS_API_KEY": canary("payments"), "REFUNDS_SIGNING_KEY": canary("signing")}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    settings.WARDEN = {**settings.WARDEN, "SECRET_GRANTS": {name: ["team-a"] for name in values}}
    headers = {"X-Pay": "{secret:PAYMENTS_API_KEY}", "Authorization": "Signed {secret:REFUNDS_SIGNING_KEY}"}
    for name, path in (("echo.headers", "/echo"), ("echo.refuse", "/refuse")):
        response = client.post("/admin/tools/httptool/add/",
                               http_form(team_a, echo.url + path, name=name, headers=json.dumps(headers)))  # fmt: skip
        assert response.status_code == 302, response.content.decode()[:3000]
    run = call_run(team_a, "echo.headers", "echo.refuse")
    assert run.status == Run.Status.NEEDS_ATTENTION, run.status_reason  # the refusal failed the step

    # The service got the credentials, and quoted them back in every shape.
    assert (
        values["PAYMENTS_API_KEY"] in echo.received() and f"Signed {values['REFUNDS_SIGNING_KEY']}" in echo.received()
    )
    answered = ToolOperation.objects.get(run=run, tool="echo.headers")
    assert answered.status == OS.COMMITTED and "[secret]" in answered.result["headers"], answered.result
    assert "echo.refuse: HTTP 400: refused: ...." in run.status_reason, run.status_reason

    # The Authorization header's whole value too: its shapes hold the signing key at another alignment.
    sent = [*values.values(), f"Signed {values['REFUNDS_SIGNING_KEY']}"]
    assert found(sent, everywhere(run, client, django_user_model, caplog)) == []


def test_an_mcp_server_that_quotes_its_secret_in_its_listing_answers_and_errors_leaves_no_shape_of_it(
    team_a, hostile_mcp, monkeypatch, settings, caplog, capfd, client, django_user_model, demo
):
    caplog.set_level(logging.DEBUG)
    value = canary("tickets")
    monkeypatch.setenv("TICKETS_TOKEN", value)
    settings.WARDEN = {**settings.WARDEN, "SECRET_GRANTS": {"TICKETS_TOKEN": ["team-a"]}}
    data = mcp_form(team_a, transport="stdio", command="hostile", secrets='["TICKETS_TOKEN"]', timeout_seconds="20")
    response = client.post("/admin/tools/mcpserver/add/", data)
    assert response.status_code == 302, response.content.decode()[:3000]
    confirm_reads(team_a, "helpdesk.leak", "helpdesk.fail")
    run = call_run(team_a, "helpdesk.leak", "helpdesk.fail")
    assert run.status == Run.Status.NEEDS_ATTENTION, run.status_reason

    assert value in hostile_mcp.read_text()  # the server was given it, and quoted it back every way
    assert ToolOperation.objects.get(run=run, tool="helpdesk.leak").status == OS.COMMITTED
    assert "helpdesk.fail: the server answered with an error" in run.status_reason, run.status_reason
    assert found([value], everywhere(run, client, django_user_model, caplog)) == []
    # What the server printed on its stderr reaches the log scrubbed, and the process's own stderr not at all.
    assert found([value], capfd.readouterr().err) == []
    assert "wrote on stderr" in caplog.text and "[secret]" in caplog.text
    assert AuditEvent.objects.get(action="mcp_server_list").outcome == "listed"


# --- 3. no header that changes where or how the request goes ----------------------------------------

FORBIDDEN = [
    ({"headers": {"Host": "payments-admin.internal"}}, "Host"),
    ({"headers": {"content-length": "0"}}, "content-length"),
    ({"headers": {"Transfer-Encoding": "chunked"}}, "Transfer-Encoding"),
    ({"headers": {"Connection": "close"}}, "Connection"),
    ({"headers": {"X-Forwarded-Host": "payments-admin.internal"}}, "X-Forwarded-Host"),
    ({"headers": {"Proxy-Authorization": "Basic eA=="}}, "Proxy-Authorization"),
    ({"headers": {"Forwarded": "host=payments-admin.internal"}}, "Forwarded"),
    (
        {
            "idempotency_header": "Host",
            "tool_class": "idempotent_write",
            "method": "POST",
            "reversibility": "irreversible",
        },
        "Host",
    ),  # fmt: skip
]


@pytest.mark.parametrize("change,header", FORBIDDEN, ids=[f"{next(iter(c))}:{h}" for c, h in FORBIDDEN])
def test_a_declaration_may_not_set_where_or_how_the_request_goes(team_a, echo, client, change, header):
    fields = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in change.items()}
    response = client.post("/admin/tools/httptool/add/", http_form(team_a, echo.url + "/echo", **fields))
    page = html.unescape(response.content.decode())
    assert response.status_code == 200 and f"{header}: a header Warden sets itself" in page, page[:3000]
    assert not HttpTool.objects.exists()
    if "headers" in change:  # an MCP server's headers, alike
        data = mcp_form(team_a, url=echo.url + "/mcp", headers=fields["headers"])
        response = client.post("/admin/tools/mcpserver/add/", data)
        assert response.status_code == 200 and f"{header}: a header Warden sets itself" in html.unescape(
            response.content.decode()
        )
        assert not McpServer.objects.exists() and echo.requests == []


def test_a_host_header_written_straight_to_the_database_is_not_sent(team_a, echo, demo):
    HttpTool.objects.create(project=team_a, name="echo.headers", method="GET", url=echo.url + "/echo",
                            arguments_schema={"type": "object"}, tool_class="read_only",
                            headers={"Host": "payments-admin.internal"})  # fmt: skip
    run = call_run(team_a, "echo.headers")
    assert echo.requests == []
    assert run.status == Run.Status.NEEDS_ATTENTION, run.status_reason
    assert "Host: a header Warden sets itself" in run.status_reason, run.status_reason
