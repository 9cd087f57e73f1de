"""MCP tools: a project connects an MCP server (the official SDK's, examples/refunds/tickets_mcp.py, over
stdio and streamable HTTP, started for real); saving it lists its tools with the class their annotations
suggest; every tool waits for a reviewer like any unclassified write until a project admin confirms a
class; every call goes through the gate and the ledger with the run's idempotency key,
and the server's own record of what it did is counted."""

import html
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from policy.models import ApprovalPolicy, ApprovalRequest
from runs.models import Run
from runs.services import run_start
from tenancy.access import default_project, membership_grant
from tenancy.models import AuditEvent
from tests.conftest import decide, free_port, wait_for
from tests.runs.test_engine import finished, scripted_workflow
from tools.catalog import tool_spec
from tools.classifications import tool_classification_set
from tools.mcp_tools import annotation_class, mcp_list, mcp_tools_store
from tools.models import McpServer, McpTool, ToolOperation

OS = ToolOperation.Status
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "refunds" / "tickets_mcp.py"


@pytest.fixture
def effects_file(tmp_path, monkeypatch):
    path = tmp_path / "tickets.jsonl"
    monkeypatch.setenv("TICKETS_EFFECTS", str(path))
    return path


def effects(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def stdio_server(**fields) -> McpServer:
    server = McpServer.objects.create(project=default_project(), name="helpdesk", transport="stdio",
                                      command="tickets", timeout_seconds=20, **fields)  # fmt: skip
    mcp_tools_store(server, mcp_list(server))
    return server


@pytest.fixture
def http_server(effects_file):
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(EXAMPLE), "--http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}/mcp"
    server = McpServer(project=default_project(), name="helpdesk", transport="http", url=url, timeout_seconds=20)

    def answers():
        try:
            return mcp_list(server)
        except Exception:  # noqa: BLE001  (not up yet)
            return None

    wait_for(answers, timeout=30, interval=0.3, message="the MCP server to answer")
    yield server
    proc.kill()
    proc.wait()


def ticket_run(tool: str, arguments: dict):
    wf = scripted_workflow(
        f"mcp-{uuid.uuid4().hex[:8]}",
        [{"tool": tool, "arguments": arguments}, {"final": {"answer": "{last}"}}],
        tools=[tool],
    )
    return run_start(workflow=wf.slug)


def test_annotations_map_to_classes_and_silence_is_the_most_dangerous():
    assert annotation_class({"readOnlyHint": True}) == ("read_only", "")
    assert annotation_class({"idempotentHint": True, "destructiveHint": False}) == ("idempotent_write", "irreversible")
    assert annotation_class({"destructiveHint": False}) == ("non_idempotent_write", "irreversible")
    assert annotation_class({}) == annotation_class(None) == ("non_idempotent_write", "irreversible")


def test_saving_a_server_in_the_admin_lists_and_classifies_its_tools(admin_client, db, effects_file):
    response = admin_client.post(
        "/admin/tools/mcpserver/add/",
        {"project": default_project().id, "name": "helpdesk", "transport": "stdio", "command": "tickets",
         "headers": "{}", "secrets": "[]", "timeout_seconds": "20", "enabled": "on",
         "tools-TOTAL_FORMS": "0", "tools-INITIAL_FORMS": "0"},
    )  # fmt: skip
    assert response.status_code == 302, response.content.decode()[:3000]
    classes = {t.name: (t.tool_class, t.reversibility) for t in McpTool.objects.all()}
    assert classes == {
        "helpdesk.search_tickets": ("read_only", ""),
        "helpdesk.add_comment": ("idempotent_write", "irreversible"),
        "helpdesk.create_ticket": ("non_idempotent_write", "irreversible"),
    }
    spec = tool_spec("helpdesk.create_ticket", default_project().id)
    assert spec.kind == "mcp" and not spec.classified and spec.parameters["required"] == ["title"]


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"transport": "http", "url": "http://127.0.0.1:{port}/mcp"}, "did not answer"),
        ({"transport": "http", "url": "http://10.9.8.7/mcp"}, "host must be one this deployment allows"),
        ({"transport": "stdio", "command": "rm-rf"}, "one of the commands this deployment names"),
        (
            {"transport": "stdio", "command": "tickets", "secrets": '["NOT_SET_ANYWHERE"]'},
            "the secret NOT_SET_ANYWHERE is not granted to project default",
        ),
        ({"transport": "stdio", "command": "tickets", "secrets": '["REDIS_URL"]'}, "REDIS_URL is one of Warden's own"),
        (
            {"transport": "http", "url": "http://127.0.0.1:{port}/mcp", "headers": '{"Host": "admin.internal"}'},
            "Host: a header Warden sets itself",
        ),
        ({"transport": "stdio", "command": "tickets", "secrets": '"TICKETS_TOKEN"'}, "a list of secret names"),
    ],
    ids=["no-answer", "host", "command", "secret", "warden-setting", "host-header", "secrets-not-a-list"],
)
def test_a_server_that_cannot_be_used_is_not_saved(admin_client, db, fields, message):
    data = {
        "project": default_project().id,
        "name": "helpdesk",
        "headers": "{}",
        "secrets": "[]",
        "timeout_seconds": "5",
        "enabled": "on",
        "tools-TOTAL_FORMS": "0",
        "tools-INITIAL_FORMS": "0",
        **fields,
    }
    data["url"] = data.get("url", "").replace("{port}", str(free_port()))
    response = admin_client.post("/admin/tools/mcpserver/add/", data)
    page = html.unescape(response.content.decode())
    assert response.status_code == 200 and message in page, page[:3000]
    assert not McpServer.objects.exists() and not McpTool.objects.exists()


@pytest.mark.parametrize(
    "fields,field,message",
    [
        ({"headers": "null"}, "headers", "an object, or {} for none"),
        ({"secrets": "null"}, "secrets", "a list, or [] for none"),
        ({"transport": "http", "url": "http://127.0.0.1:9/mcp", "headers": "null"}, "headers",
         "an object, or {} for none"),
    ],
    ids=["stdio-headers", "stdio-secrets", "http-headers"],
)  # fmt: skip
def test_a_json_field_left_null_is_a_form_error_on_that_field_and_saves_nothing(admin_client, db, fields, field,
                                                                                message):  # fmt: skip
    data = {"project": default_project().id, "name": "helpdesk", "transport": "stdio", "command": "tickets",
            "headers": "{}", "secrets": "[]", "timeout_seconds": "5", "enabled": "on",
            "tools-TOTAL_FORMS": "0", "tools-INITIAL_FORMS": "0", **fields}  # fmt: skip
    response = admin_client.post("/admin/tools/mcpserver/add/", data)
    assert response.status_code == 200 and response.context["adminform"].form.errors == {field: [message]}
    assert not McpServer.objects.exists() and not McpTool.objects.exists()


def test_an_unannotated_tool_waits_for_a_reviewer_and_goes_out_once_with_its_key(
    demo_tx, worker, effects_file, django_user_model
):
    stdio_server()
    reviewer = django_user_model.objects.create_user(username="rita", password="x-pass-123456")
    membership_grant(user=reviewer, project=default_project(), role="reviewer")
    run = ticket_run("helpdesk.create_ticket", {"title": "Refund for order 1001"})
    wait_for(lambda: ApprovalRequest.objects.filter(run=run).exists(), message="the approval request")
    assert effects(effects_file) == []
    decide(request_id=ApprovalRequest.objects.get(run=run).id, user=reviewer, approve=True)
    run = finished(run, timeout=60)
    assert run.status == Run.Status.COMPLETED, run.status_reason
    [made] = effects(effects_file)
    op = ToolOperation.objects.get(run=run, tool="helpdesk.create_ticket")
    assert (op.status, op.result["id"], made["key"]) == (OS.COMMITTED, made["id"], op.idempotency_key)
    assert op.verdict["classified_by"] == "unclassified" and op.tool_class == "non_idempotent_write"


def confirm(tool: str, tool_class: str, reversibility: str, *, approval: str = ""):
    """A project admin confirms an MCP tool's class (tools/classifications.py): the server only suggests."""
    admin, _ = get_user_model().objects.get_or_create(username="ada-admin")
    membership_grant(user=admin, project=default_project(), role="admin")
    return tool_classification_set(user=admin, project=default_project(), tool=tool, tool_class=tool_class,
                                   reversibility=reversibility, approval=approval)  # fmt: skip


def test_a_read_only_hint_alone_never_makes_a_read_until_a_project_admin_confirms_it(demo_tx, worker, effects_file):
    """Issue 25, finding 6: the server's readOnlyHint made its tool a read that ran unreviewed with no
    intent row. It is the server's suggestion; the tool waits until a project admin confirms a class."""
    stdio_server()
    assert McpTool.objects.get(name="helpdesk.search_tickets").tool_class == "read_only"  # the suggestion
    run = ticket_run("helpdesk.search_tickets", {"query": "refund"})
    wait_for(lambda: ApprovalRequest.objects.filter(run=run).exists(), message="the unconfirmed tool to wait")
    op = ToolOperation.objects.get(run=run)  # an intent row, as for any write: nothing was called
    assert (op.status, op.tool_class, op.verdict["classified_by"]) == (
        OS.AWAITING_APPROVAL, "non_idempotent_write", "unclassified"
    )  # fmt: skip

    confirm("helpdesk.search_tickets", "read_only", "")  # the suggestion, confirmed by one admin: at once
    run = finished(ticket_run("helpdesk.search_tickets", {"query": "refund"}), timeout=60)
    assert run.status == Run.Status.COMPLETED, run.status_reason
    op = ToolOperation.objects.get(run=run)
    assert op.tool_class == "read_only" and op.verdict["classified_by"] == "mcp"


def test_a_stricter_word_of_the_project_holds_every_call(demo_tx, worker, effects_file):
    stdio_server()
    confirm("helpdesk.search_tickets", "non_idempotent_write", "irreversible", approval="always")
    run = ticket_run("helpdesk.search_tickets", {"query": "refund"})
    wait_for(lambda: ApprovalRequest.objects.filter(run=run).exists(), message="the stricter class to hold it")
    assert effects(effects_file) == []


def test_a_streamable_http_server_is_called_through_the_ledger(demo_tx, worker, http_server, effects_file):
    http_server.save()
    mcp_tools_store(http_server, mcp_list(http_server))
    confirm("helpdesk.add_comment", "idempotent_write", "irreversible")
    ApprovalPolicy.objects.create(name="comments unattended", effect="waive", project=default_project(),
                                  tool="helpdesk.add_comment")  # fmt: skip
    run = finished(ticket_run("helpdesk.add_comment", {"ticket_id": "TCK-1", "text": "refunded"}), timeout=60)
    assert run.status == Run.Status.COMPLETED, run.status_reason
    [comment] = effects(effects_file)
    op = ToolOperation.objects.get(run=run)
    assert op.status == OS.COMMITTED and op.tool_class == "idempotent_write" and comment["key"] == op.idempotency_key
    assert op.result == {"ticket_id": "TCK-1", "commented": True}
    assert op.verdict["waiver"] is not None


def test_bad_arguments_are_refused_by_the_tools_schema_and_call_nothing(demo_tx, worker, effects_file):
    stdio_server()
    run = finished(ticket_run("helpdesk.add_comment", {"ticket_id": 7}), timeout=60)
    assert not ToolOperation.objects.filter(run=run).exists() and effects(effects_file) == []


def test_each_listing_on_save_is_audited_with_its_outcome_and_no_secret(admin_client, db, effects_file, settings,
                                                                        monkeypatch):  # fmt: skip
    token = f"tickets-{uuid.uuid4().hex}"
    monkeypatch.setenv("TICKETS_TOKEN", token)
    settings.WARDEN = {**settings.WARDEN, "SECRET_GRANTS": {"TICKETS_TOKEN": ["default"]}}
    base = {"project": default_project().id, "name": "helpdesk", "headers": "{}", "secrets": "[]",
            "timeout_seconds": "5", "enabled": "on", "tools-TOTAL_FORMS": "0", "tools-INITIAL_FORMS": "0"}  # fmt: skip
    attempts = [
        {"transport": "http", "url": f"http://127.0.0.1:{free_port()}/mcp",
         "headers": '{"Authorization": "Bearer {secret:TICKETS_TOKEN}"}'},
        {"transport": "stdio", "command": "tickets", "secrets": '["PAYMENTS_API_KEY"]'},
        {"transport": "stdio", "command": "tickets", "secrets": '["TICKETS_TOKEN"]', "timeout_seconds": "20"},
        {"transport": "http", "url": "http://ops:typed-password@10.9.8.7/mcp"},
    ]  # fmt: skip
    for fields in attempts:
        admin_client.post("/admin/tools/mcpserver/add/", {**base, **fields})
    rows = AuditEvent.objects.filter(action="mcp_server_list").order_by("id")
    assert [r.outcome for r in rows] == ["unreachable", "refused", "listed", "refused"]
    assert rows[3].detail["at"] == "http://10.9.8.7/mcp"  # a password typed into the URL is not kept
    assert all(r.project_id == default_project().id and r.actor.is_superuser for r in rows)
    assert "the secret PAYMENTS_API_KEY is not granted to project default" in rows[1].detail["why"]
    assert sorted(rows[2].detail["tools"]) == ["add_comment", "create_ticket", "search_tickets"]
    assert token not in json.dumps([r.detail for r in rows])
    assert McpServer.objects.count() == 1
