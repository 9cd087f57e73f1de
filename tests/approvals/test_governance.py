"""Four eyes on the rules themselves (issue 25): a change that loosens a project's rules, made in the admin
by one of its admins, changes nothing until another admin of the project approves it on the reviewer
queue; tightening applies at once; a superuser's change applies at once; only a superuser sets a
project to single-admin governance. Every path is audited with the fields before and after."""

import json

import pytest
from django.contrib.auth.models import Permission
from django.forms.models import model_to_dict
from django.urls import reverse

from policy.models import ApprovalPolicy
from tenancy.access import default_project, membership_grant
from tenancy.models import AuditEvent, ChangeRequest, Project
from tools.models import HttpTool, McpServer, McpTool, ToolClassification

SCHEMA = {"type": "object", "properties": {"charge_id": {"type": "string"}}, "required": ["charge_id"]}


@pytest.fixture
def admins(db, django_user_model, client):
    """Two staff admins of the default project (every Django permission: their role is what limits
    them), and a logged-in client for each."""

    def admin(name: str, project=None):
        user = django_user_model.objects.create_user(username=name, password=f"{name}-pass-123", is_staff=True)
        user.user_permissions.set(Permission.objects.all())
        membership_grant(user=user, project=project or default_project(), role="admin")
        return user

    return admin


def as_user(client, user):
    client.logout()
    client.force_login(user)
    return client


def http_tool(**fields) -> HttpTool:
    values = {"project": default_project(), "name": "payments.get_charge", "method": "GET",
              "url": "http://127.0.0.1:8701/v1/charges/{charge_id}", "arguments_schema": SCHEMA,
              "tool_class": "read_only", "reversibility": "", **fields}  # fmt: skip
    return HttpTool.objects.create(**values)


def form_of(row, **changes) -> dict:
    """The row's admin change form as a browser posts it, with ``changes`` (an unticked box is absent)."""
    data = {**model_to_dict(row), **changes}
    form = {}
    for name, value in data.items():
        if isinstance(value, bool):
            if value:
                form[name] = "on"
        else:
            form[name] = json.dumps(value) if isinstance(value, dict | list) else ("" if value is None else value)
    return form


def post_change(client, row, **changes):
    opts = row._meta
    url = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[row.pk])
    return client.post(url, form_of(row, **changes), follow=True)


def decide_on_the_queue(client, change: ChangeRequest, decision: str, note: str = ""):
    return client.post(reverse("approvals-change-decide", args=[change.id]), {"decision": decision, "note": note})


def test_an_http_tools_new_url_waits_for_a_second_admin_then_applies_audited(admins, client):
    ada, abe = admins("ada"), admins("abe")
    tool = http_tool()
    response = post_change(as_user(client, ada), tool, url="http://127.0.0.1:8702/v1/charges/{charge_id}")
    assert "waits for another admin" in response.content.decode()
    tool.refresh_from_db()
    assert tool.url.startswith("http://127.0.0.1:8701")  # nothing changed yet
    change = ChangeRequest.objects.get()
    assert (change.status, change.loosens, change.requested_by) == ("pending", ["its url changes"], ada)
    assert change.before == {"url": "http://127.0.0.1:8701/v1/charges/{charge_id}"}

    mine = decide_on_the_queue(client, change, "approve")  # the asker cannot approve their own change
    change.refresh_from_db()
    assert change.status == "pending" and mine.status_code == 302

    queue = as_user(client, abe).get(reverse("approvals-queue")).content.decode()
    assert f'id="change-{change.id}"' in queue and "its url changes" in queue
    assert decide_on_the_queue(client, change, "approve").status_code == 302
    tool.refresh_from_db()
    change.refresh_from_db()
    assert tool.url.startswith("http://127.0.0.1:8702") and (change.status, change.decided_by) == ("applied", abe)
    event = AuditEvent.objects.filter(action="admin:change", target=f"tools.httptool {tool.pk}").get()
    assert event.actor == abe and event.detail["asked_by"] == "ada"
    assert event.detail["before"]["url"].startswith("http://127.0.0.1:8701")
    assert event.detail["after"]["url"].startswith("http://127.0.0.1:8702")


def test_a_description_change_applies_at_once_and_is_audited(admins, client):
    ada = admins("ada")
    tool = http_tool()
    post_change(as_user(client, ada), tool, description="Read a charge")
    tool.refresh_from_db()
    assert tool.description == "Read a charge" and not ChangeRequest.objects.exists()
    event = AuditEvent.objects.get(action="admin:change", target=f"tools.httptool {tool.pk}")
    assert event.detail["changed"] == ["description"] and event.detail["after"] == {"description": "Read a charge"}


def test_a_rejection_needs_a_reason_and_changes_nothing(admins, client):
    ada, abe = admins("ada"), admins("abe")
    tool = http_tool(method="POST", tool_class="non_idempotent_write", reversibility="irreversible")
    post_change(as_user(client, ada), tool, headers={"X-Mode": "live"})
    change = ChangeRequest.objects.get()
    as_user(client, abe)
    decide_on_the_queue(client, change, "reject")
    change.refresh_from_db()
    assert change.status == "pending"
    decide_on_the_queue(client, change, "reject", "we do not send that header")
    change.refresh_from_db()
    tool.refresh_from_db()
    assert change.status == "rejected" and tool.headers == {}


def test_a_stale_request_is_not_applied(admins, client, django_user_model):
    ada, abe = admins("ada"), admins("abe")
    tool = http_tool()
    post_change(as_user(client, ada), tool, url="http://127.0.0.1:8702/v1/charges/{charge_id}")
    change = ChangeRequest.objects.get()
    root = django_user_model.objects.create_superuser("root", "root@example.com", "root-pass-123")
    post_change(as_user(client, root), tool, url="http://127.0.0.1:8703/v1/charges/{charge_id}")  # at once
    tool.refresh_from_db()
    assert tool.url.startswith("http://127.0.0.1:8703")
    decide_on_the_queue(as_user(client, abe), change, "approve")
    change.refresh_from_db()
    tool.refresh_from_db()
    assert change.status == "stale" and tool.url.startswith("http://127.0.0.1:8703")


def test_single_admin_governance_is_a_superusers_choice(admins, client, django_user_model):
    ada = admins("ada")
    project = default_project()
    url = reverse("admin:tenancy_project_change", args=[project.pk])
    as_user(client, ada).post(url, {"slug": project.slug, "name": project.name, "governance": "single_admin",
                                    "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"})  # fmt: skip
    project.refresh_from_db()
    assert project.governance == "four_eyes"
    root = django_user_model.objects.create_superuser("root", "root@example.com", "root-pass-123")
    as_user(client, root).post(url, {"slug": project.slug, "name": project.name, "governance": "single_admin",
                                     "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"})  # fmt: skip
    project.refresh_from_db()
    assert project.governance == "single_admin"
    tool = http_tool()
    post_change(as_user(client, ada), tool, url="http://127.0.0.1:8702/v1/charges/{charge_id}")
    tool.refresh_from_db()
    assert tool.url.startswith("http://127.0.0.1:8702") and not ChangeRequest.objects.exists()


def test_policies_loosen_only_with_a_second_admin_and_tighten_at_once(admins, client):
    ada, abe = admins("ada"), admins("abe")
    project = default_project()
    as_user(client, ada)
    add = reverse("admin:policy_approvalpolicy_add")
    base = {"name": "refunds", "effect": "require", "project": project.id, "tool": "payments.refund",
            "condition": "{}", "quorum": "2", "decided_by_role": "admin", "on_expiry": "reject",
            "on_reject": "tell_agent", "enabled": "on"}  # fmt: skip
    client.post(add, base)
    policy = ApprovalPolicy.objects.get()  # a new requiring policy: at once
    assert not ChangeRequest.objects.exists()

    post_change(client, policy, quorum=1)  # weaker
    post_change(client, policy, enabled=False)  # disabled
    policy.refresh_from_db()
    assert (policy.quorum, policy.enabled) == (2, True)
    reasons = [c.loosens for c in ChangeRequest.objects.order_by("id")]
    assert reasons == [["its quorum drops from 2 to 1"], ["it is disabled"]]

    post_change(client, policy, quorum=3)  # stricter: at once
    policy.refresh_from_db()
    assert policy.quorum == 3

    client.post(add, {**base, "name": "refunds unattended", "effect": "waive", "quorum": "1"})
    assert ApprovalPolicy.objects.count() == 1  # a waiver waits
    waiver = ChangeRequest.objects.get(action="create")
    assert waiver.loosens == ["a waiver lets irreversible calls leave without a reviewer"]
    decide_on_the_queue(as_user(client, abe), waiver, "approve")
    made = ApprovalPolicy.objects.get(effect="waive")
    assert made.project == project and made.tool == "payments.refund"
    stale = ChangeRequest.objects.get(after__quorum=1, action="change")
    decide_on_the_queue(client, stale, "approve")  # asked when the quorum was 2: it is 3 now
    stale.refresh_from_db()
    assert stale.status == "stale"


@pytest.mark.parametrize(
    "fields,error",
    [
        ({"effect": "waive", "project": ""}, "a waiver is one project"),
        ({"condition": '{"field": "amount"}'}, "op one of"),
        ({"condition": "null"}, "an object"),
        ({"quorum": "0"}, "at least 1"),
        ({"effect": "sometimes"}, "Select a valid choice"),
    ],
)
def test_a_bad_policy_is_a_form_error_and_writes_nothing(admins, client, django_user_model, fields, error):
    root = django_user_model.objects.create_superuser("root", "root@example.com", "root-pass-123")
    data = {"name": "p", "effect": "require", "project": default_project().id, "tool": "", "condition": "{}",
            "quorum": "1", "decided_by_role": "reviewer", "on_expiry": "reject", "on_reject": "tell_agent",
            "enabled": "on", **fields}  # fmt: skip
    response = as_user(client, root).post(reverse("admin:policy_approvalpolicy_add"), data)
    assert response.status_code == 200 and error in response.content.decode(), response.content.decode()[:2000]
    assert not ApprovalPolicy.objects.exists() and not ChangeRequest.objects.exists()


def test_an_mcp_servers_new_address_is_not_called_until_approved(admins, client, monkeypatch):
    """Saving a server lists its tools (an outbound call with its headers): a new address waits for the
    second admin before anything is sent to it."""
    ada, abe = admins("ada"), admins("abe")
    server = McpServer.objects.create(project=default_project(), name="helpdesk", transport="http",
                                      url="http://127.0.0.1:9301/mcp")  # fmt: skip
    asked = []
    # Where the listing leaves (the server is not running): what would have been asked, and of whom.
    monkeypatch.setattr("tools.mcp_tools.mcp_list", lambda s: asked.append(s.url) or [])
    data = {"project": server.project_id, "name": "helpdesk", "transport": "http", "url": "http://127.0.0.1:9302/mcp",
            "command": "", "headers": "{}", "secrets": "[]", "timeout_seconds": "5", "enabled": "on",
            "tools-TOTAL_FORMS": "0", "tools-INITIAL_FORMS": "0"}  # fmt: skip
    url = reverse("admin:tools_mcpserver_change", args=[server.pk])
    response = as_user(client, ada).post(url, data, follow=True)
    assert "waits for another admin" in response.content.decode()
    server.refresh_from_db()
    assert asked == [] and server.url.endswith(":9301/mcp")
    decide_on_the_queue(as_user(client, abe), ChangeRequest.objects.get(), "approve")
    server.refresh_from_db()
    assert asked == ["http://127.0.0.1:9302/mcp"] and server.url.endswith(":9302/mcp")


def test_another_projects_admin_cannot_see_or_decide_a_change(admins, client):
    ada = admins("ada")
    mallory = admins("mallory", project=Project.objects.create(slug="rival", name="Rival"))
    tool = http_tool()
    post_change(as_user(client, ada), tool, url="http://127.0.0.1:8702/v1/charges/{charge_id}")
    change = ChangeRequest.objects.get()
    as_user(client, mallory)
    assert f"change-{change.id}" not in client.get(reverse("approvals-queue")).content.decode()
    assert decide_on_the_queue(client, change, "approve").status_code == 404
    assert decide_on_the_queue(client, change, "withdraw").status_code == 404
    change.refresh_from_db()
    assert change.status == "pending"


def test_a_bad_decision_on_the_queue_is_refused_and_changes_nothing(admins, client):
    ada, abe = admins("ada"), admins("abe")
    tool = http_tool()
    post_change(as_user(client, ada), tool, url="http://127.0.0.1:8702/v1/charges/{charge_id}")
    change = ChangeRequest.objects.get()
    as_user(client, abe)
    for decision in ("maybe", ""):
        answer = client.post(reverse("approvals-change-decide", args=[change.id]), {"decision": decision},
                             HTTP_HX_REQUEST="true")  # fmt: skip
        assert answer.status_code == 409 and "approve, reject or withdraw" in answer.content.decode()
    assert client.get(reverse("approvals-change-decide", args=[change.id])).status_code == 405
    assert decide_on_the_queue(client, change, "withdraw").status_code == 302  # not abe's to withdraw
    change.refresh_from_db()
    tool.refresh_from_db()
    assert change.status == "pending" and tool.url.startswith("http://127.0.0.1:8701")


def test_an_mcp_tool_is_confirmed_at_its_suggestion_at_once_and_below_it_by_two_admins(admins, client):
    ada, abe = admins("ada"), admins("abe")
    server = McpServer.objects.create(project=default_project(), name="helpdesk", transport="http",
                                      url="http://127.0.0.1:9301/mcp")  # fmt: skip
    suggested = McpTool.objects.create(server=server, name="helpdesk.create_ticket", remote_name="create_ticket",
                                       tool_class="non_idempotent_write", reversibility="irreversible",
                                       input_schema={"type": "object"})  # fmt: skip
    McpTool.objects.create(server=server, name="helpdesk.search", remote_name="search", tool_class="read_only",
                           annotations={"readOnlyHint": True}, input_schema={"type": "object"})  # fmt: skip
    changelist = reverse("admin:tools_mcptool_changelist")
    as_user(client, ada).post(changelist, {"action": "confirm_suggested_class", "_selected_action": [
        t.pk for t in McpTool.objects.all()]})  # fmt: skip
    confirmed = dict(ToolClassification.objects.values_list("tool", "tool_class"))
    assert confirmed == {"helpdesk.search": "read_only", "helpdesk.create_ticket": "non_idempotent_write"}
    ToolClassification.objects.filter(tool=suggested.name).delete()
    # A read where the server suggests a write: one admin's word is not enough.
    add = reverse("admin:tools_toolclassification_add")
    client.post(add, {"project": default_project().id, "tool": suggested.name, "tool_class": "read_only",
                      "reversibility": "", "approval": "", "note": ""})  # fmt: skip
    assert not ToolClassification.objects.filter(tool=suggested.name).exists()
    change = ChangeRequest.objects.get()
    assert change.loosens == [
        "the class confirmed is below what its MCP server suggests: its class is lowered from non_idempotent_write "
        "to read_only",
        "the class confirmed is below what its MCP server suggests: its reversibility is lowered from irreversible "
        "to none (a read)",
    ]
    decide_on_the_queue(as_user(client, abe), change, "approve")
    assert ToolClassification.objects.get(tool=suggested.name).tool_class == "read_only"
