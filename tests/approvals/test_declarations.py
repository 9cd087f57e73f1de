"""Declarations as code (issue 26, finding 9): a project's tools, classifications, workflows, policies and
waivers kept in a file, applied with `manage.py warden_apply` or `PUT /api/v1/projects/{slug}/declarations`
with the admin's checks, all or nothing, audited and under the same four-eyes rules; exported back with
`warden_export` (or GET), secrets by name only."""

import json
import re
import uuid
from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError

from agents.models import Agent, Workflow
from approvals.declarations.apply import declarations_items
from approvals.declarations.kinds import ORDER
from approvals.governance import change_request_decide
from policy.models import ApprovalPolicy
from tenancy.access import default_project, membership_grant
from tenancy.models import AuditEvent, ChangeRequest, Project
from tenancy.tokens import api_token_create
from tools.models import HttpTool, ToolClassification

SCHEMA = {"type": "object", "properties": {"charge_id": {"type": "string"}}, "required": ["charge_id"]}
BASE = "http://127.0.0.1:8701/v1/charges/{charge_id}"


def document(**changes) -> dict:
    doc = {
        "project": "default",
        "http_tools": [
            {"name": "payments.get_charge", "method": "GET", "url": BASE, "arguments_schema": SCHEMA,
             "tool_class": "read_only", "headers": {"Authorization": "Bearer {secret:PAYMENTS_API_KEY}"}},
            {"name": "payments.refund", "method": "POST", "url": BASE + "/refunds", "arguments_schema": SCHEMA,
             "tool_class": "non_idempotent_write", "reversibility": "irreversible", "description": "Refund a charge"},
        ],
        "classifications": [
            {"tool": "crm.note", "tool_class": "non_idempotent_write", "reversibility": "irreversible"},
        ],
        "workflows": [
            {"slug": "refund-desk", "name": "Refund desk", "tool_policies": {"payments.refund": {"approval": "always"}},
             "tasks": [{"key": "refund", "agent": "refund-agent", "objective": "Refund the charge"}]},
        ],
        "policies": [
            {"name": "refunds wait for two", "tool": "payments.refund", "quorum": 2, "workflow": "refund-desk"},
        ],
    }  # fmt: skip
    return {**doc, **changes}


@pytest.fixture
def secret(monkeypatch, settings):
    value = f"key-{uuid.uuid4().hex}"
    monkeypatch.setenv("PAYMENTS_API_KEY", value)
    settings.WARDEN = {**settings.WARDEN, "SECRET_GRANTS": {"PAYMENTS_API_KEY": ["default"]}}
    return value


@pytest.fixture
def people(db, django_user_model, secret):
    """Two admins of the default project, a viewer of it, the admin of another project and a superuser."""
    other = Project.objects.create(slug="other", name="Other")

    def person(name, role=None, project=None, **flags):
        user = django_user_model.objects.create_user(username=name, password=f"{name}-pass-123", **flags)
        if role:
            membership_grant(user=user, project=project or default_project(), role=role)
        return user

    return {
        "ada": person("ada", "admin"),
        "abe": person("abe", "admin"),
        "vera": person("vera", "viewer"),
        "otto": person("otto", "admin", other),
        "root": person("root", is_superuser=True, is_staff=True),
    }


def write(tmp_path, doc, name="warden.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc) if name.endswith(".yaml") else json.dumps(doc))
    return path


def apply(path, username, *flags) -> str:
    out = StringIO()
    call_command("warden_apply", str(path), "--as", username, *flags, stdout=out)
    return out.getvalue()


def apply_json(path, username, *flags) -> dict:
    return json.loads(apply(path, username, "--json", *flags))


def statuses(result: dict) -> dict:
    return {f"{item['kind']}[{item['name']}]": item["status"] for item in result["items"]}


def put(client, user, path, body, *, scopes=("read", "admin"), **query):
    token = api_token_create(user=user, scopes=list(scopes))[1]
    suffix = "?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else ""
    return client.put(f"/api/v1/projects{path}{suffix}", data=json.dumps(body) if not isinstance(body, str) else body,
                      content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")  # fmt: skip


def get(client, user, path, *, scopes=("read",)):
    token = api_token_create(user=user, scopes=list(scopes))[1]
    return client.get(f"/api/v1/projects{path}", HTTP_AUTHORIZATION=f"Bearer {token}")


def snapshot() -> list:
    return [
        list(HttpTool.objects.values_list("name", "url", "description", "headers").order_by("name")),
        list(ToolClassification.objects.values_list("tool", "tool_class", "approval").order_by("tool")),
        list(Workflow.objects.values_list("slug", "name", "tool_policies").order_by("slug")),
        list(ApprovalPolicy.objects.values_list("name", "effect", "quorum", "enabled").order_by("name")),
        list(ChangeRequest.objects.values_list("id", "status")),
    ]


def test_applying_creates_each_item_audited_and_applying_again_changes_nothing(people, tmp_path):
    path = write(tmp_path, document())
    first = apply_json(path, "ada")
    assert statuses(first) == {
        "http_tools[payments.get_charge]": "created",
        "http_tools[payments.refund]": "created",
        "classifications[crm.note]": "created",
        "workflows[refund-desk]": "created",
        "policies[refunds wait for two]": "created",
    }
    refund = HttpTool.objects.get(name="payments.refund")
    assert (refund.project, refund.method, refund.description) == (default_project(), "POST", "Refund a charge")
    policy = ApprovalPolicy.objects.get(name="refunds wait for two")
    assert (policy.project, policy.workflow.slug, policy.quorum) == (default_project(), "refund-desk", 2)
    assert Workflow.objects.get(slug="refund-desk").project == default_project()
    assert AuditEvent.objects.filter(action="admin:add", actor=people["ada"]).count() == 4
    assert AuditEvent.objects.filter(action="tool_classify", actor=people["ada"]).count() == 1
    summary = AuditEvent.objects.get(action="declarations_apply")
    assert len(summary.detail["created"]) == 5 and summary.project_id == default_project().id

    before, events = snapshot(), AuditEvent.objects.exclude(action="declarations_apply").count()
    again = apply(path, "ada")
    assert "0 created, 0 changed, 5 unchanged, 0 pending" in again
    assert snapshot() == before
    assert AuditEvent.objects.exclude(action="declarations_apply").count() == events  # no edit, no edit's audit


def test_a_dry_run_prints_the_diff_and_writes_nothing(people, tmp_path):
    apply(write(tmp_path, document()), "ada")
    changed = document()
    changed["http_tools"][1] = {**changed["http_tools"][1], "description": "Refund part of a charge"}
    changed["classifications"][0]["approval"] = "always"
    before, events = snapshot(), AuditEvent.objects.count()

    out = apply(write(tmp_path, changed, "changed.yaml"), "ada", "--dry-run")
    assert 'description: "Refund a charge" -> "Refund part of a charge"' in out
    assert "changed  default: classifications crm.note" in out
    assert "dry run, nothing written: 0 created, 2 changed, 3 unchanged, 0 pending" in out
    assert snapshot() == before and AuditEvent.objects.count() == events

    assert statuses(apply_json(tmp_path / "changed.yaml", "ada"))["http_tools[payments.refund]"] == "changed"
    assert HttpTool.objects.get(name="payments.refund").description == "Refund part of a charge"


def test_one_bad_item_among_several_applies_nothing_and_names_the_item_and_field(people, tmp_path):
    bad = document()
    bad["http_tools"][1] = {**bad["http_tools"][1], "method": "FETCH"}
    bad["policies"][0]["quorum"] = 0
    with pytest.raises(CommandError) as refused:
        apply(write(tmp_path, bad), "ada")
    message = str(refused.value)
    assert "nothing was applied" in message
    assert "default:http_tools[payments.refund].method:" in message
    assert "default:policies[refunds wait for two].quorum: at least 1" in message
    assert "payments.get_charge" not in message  # the good items are not blamed
    assert not HttpTool.objects.exists() and not Workflow.objects.exists() and not ApprovalPolicy.objects.exists()
    assert not ToolClassification.objects.exists()

    unknown = document()
    unknown["http_tools"][0] = {**unknown["http_tools"][0], "secret_value": "x"}
    with pytest.raises(CommandError, match=r"http_tools\[payments.get_charge\].secret_value: not a field"):
        apply(write(tmp_path, unknown, "unknown.json"), "ada")
    # A secret the project was not granted: the admin's check, by field.
    stolen = document(http_tools=[{**document()["http_tools"][0], "headers": {"X-Key": "{secret:DATABASE_URL}"}}])
    with pytest.raises(CommandError, match=r"http_tools\[payments.get_charge\].headers: X-Key"):
        apply(write(tmp_path, stolen, "stolen.yaml"), "ada")
    assert not HttpTool.objects.exists()


def test_a_loosening_waits_for_a_second_admin_202_and_the_command_says_so(people, tmp_path, client):
    apply(write(tmp_path, document()), "ada")
    waiver = {"name": "notes leave unattended", "tool": "crm.note"}
    asked = put(client, people["ada"], "/default/declarations/waivers/notes leave unattended", waiver)
    assert asked.status_code == 202, asked.json()
    [item] = asked.json()["items"]
    assert item["status"] == "pending" and item["change_request"]
    assert not ApprovalPolicy.objects.filter(effect="waive").exists()  # nothing yet
    change = ChangeRequest.objects.get(id=item["change_request"])
    assert change.loosens == ["a waiver lets irreversible calls leave without a reviewer"]
    change_request_decide(request_id=change.id, user=people["abe"], approve=True)
    assert ApprovalPolicy.objects.get(effect="waive").tool == "crm.note"
    again = put(client, people["ada"], "/default/declarations/waivers/notes leave unattended", waiver)
    assert again.status_code == 200 and again.json()["items"][0]["status"] == "unchanged"

    lowered = document()
    lowered["classifications"][0] |= {"tool_class": "read_only", "reversibility": ""}
    out = apply(write(tmp_path, lowered, "lowered.yaml"), "ada")
    assert "pending  default: classifications crm.note (waits for a second admin: change request" in out
    assert "1 change(s) loosen the rules and wait for a second admin" in out
    waiting = ChangeRequest.objects.get(status="pending")
    again = apply_json(tmp_path / "lowered.yaml", "ada")  # CI applies the file again: the same request
    assert [i["change_request"] for i in again["items"] if i["status"] == "pending"] == [waiting.id]
    assert ChangeRequest.objects.filter(status="pending").count() == 1
    assert ToolClassification.objects.get(tool="crm.note").tool_class == "non_idempotent_write"
    # A superuser's change applies at once, as in the admin.
    assert statuses(apply_json(tmp_path / "lowered.yaml", "root"))["classifications[crm.note]"] == "changed"


def test_one_projects_admin_cannot_declare_into_another_nor_the_shared_configuration(people, tmp_path, client):
    apply(write(tmp_path, document()), "ada")
    before = snapshot()
    otto, vera = people["otto"], people["vera"]
    assert put(client, otto, "/default/declarations", document()).status_code == 404
    assert put(client, otto, "/default/declarations/http_tools/payments.refund", {"method": "GET"}).status_code == 404
    assert put(client, otto, "/other/declarations", document()).status_code == 422  # the body's project is default
    with pytest.raises(CommandError, match="does not exist"):
        apply(tmp_path / "warden.yaml", "otto")
    assert put(client, vera, "/default/declarations", document()).status_code == 403  # a viewer
    assert put(client, people["ada"], "/default/declarations", document(), scopes=["read"]).status_code == 403
    # Agents are every project's: a project admin neither creates nor changes one; nor a document of no project.
    agent = put(client, people["ada"], "/default/declarations/agents/refund-agent", {"name": "Refund agent"})
    assert agent.status_code == 403 and "only a superuser" in agent.json()["message"]
    with pytest.raises(CommandError, match="superusers only"):
        apply(write(tmp_path, {"policies": [{"name": "everything waits"}]}, "shared.yaml"), "ada")
    assert snapshot() == before and not Agent.objects.exists()
    # A policy may name only its own project's workflows (or shared ones).
    Workflow.objects.create(slug="others-flow", name="x", project=Project.objects.get(slug="other"))
    theirs = put(client, people["ada"], "/default/declarations/policies/p", {"workflow": "others-flow"})
    assert theirs.status_code == 422 and theirs.json()["errors"][0]["field"] == "default:policies[p].workflow"
    assert not ApprovalPolicy.objects.filter(name="p").exists()
    denied = AuditEvent.objects.filter(outcome="denied").values_list("actor_label", flat=True)
    assert {"otto", "vera", "ada"} <= set(denied)
    assert put(client, people["root"], "/default/declarations/agents/refund-agent", {"name": "R"}).status_code == 200


def test_export_round_trips_and_names_secrets_only(people, tmp_path, client, secret):
    apply(write(tmp_path, document()), "ada")
    call_command("warden_apply", str(write(tmp_path, {"agents": [{"slug": "refund-agent", "name": "Refund agent"}]},
                                           "agents.yaml")), "--as", "root", stdout=open("/dev/null", "w"))  # fmt: skip
    out = tmp_path / "exported.yaml"
    call_command("warden_export", "--project", "default", "-o", str(out), stderr=open("/dev/null", "w"))
    text = out.read_text()
    assert "{secret:PAYMENTS_API_KEY}" in text and secret not in text
    exported = yaml.safe_load(text)
    assert exported["project"] == "default" and exported["agents"] == [{"slug": "refund-agent", "name": "Refund agent"}]
    result = apply_json(out, "ada")
    assert {item["status"] for item in result["items"]} == {"unchanged"}, result
    # Everything, as JSON, for the shell's operator; and the API's export to any member of the project.
    everything = tmp_path / "all.json"
    call_command("warden_export", "--json", "-o", str(everything), stderr=open("/dev/null", "w"))
    assert secret not in everything.read_text()
    assert {"unchanged"} == {i["status"] for i in apply_json(everything, "root")["items"]}
    answer = get(client, people["vera"], "/default/declarations")
    assert answer.status_code == 200 and answer.json() == json.loads(json.dumps(exported))
    assert secret not in answer.content.decode()
    assert get(client, people["otto"], "/default/declarations").status_code == 404


def test_bad_bodies_answer_4xx_and_write_nothing(people, client):
    ada = people["ada"]
    cases = [
        ("/default/declarations", "[1, 2]", 422),
        ("/default/declarations", "{not json", 400),
        ("/default/declarations", {"http_tools": {"name": "x"}}, 422),
        ("/default/declarations", {"http_tools": [{"method": "GET"}]}, 422),
        ("/default/declarations", {"gadgets": []}, 422),
        ("/default/declarations/gadgets/x", {}, 404),
        ("/default/declarations/http_tools/a.b", {"name": "c.d"}, 422),
        ("/default/declarations/http_tools/a.b", [], 422),
        ("/default/declarations/policies/p", {"quorum": "many"}, 422),
        ("/nowhere/declarations", {}, 404),
    ]
    for path, body, status in cases:
        answer = put(client, ada, path, body)
        assert answer.status_code == status, (path, body, answer.content)
        assert set(answer.json()) == {"code", "message", "errors"}, answer.json()
    assert put(client, ada, "/default/declarations", {}, dry_run="maybe").status_code == 422
    assert (
        client.put("/api/v1/projects/default/declarations", data="{}", content_type="application/json").status_code
        == 401
    )
    assert not HttpTool.objects.exists() and not ApprovalPolicy.objects.exists()


def test_values_of_the_wrong_shape_are_field_errors_not_text(people, tmp_path):
    """YAML gives types the admin's form (made for posted text) would quietly turn into text."""
    path = tmp_path / "shapes.yaml"
    path.write_text(
        "project: default\n"
        "http_tools:\n"
        "  - {name: a.b, method: GET, url: 'http://127.0.0.1:8701/x', tool_class: read_only,\n"
        "     arguments_schema: {type: object}, enabled: 'no', description: {what: 1}}\n"
        "policies:\n"
        "  - {name: dated, condition: {field: day, op: '==', value: 2026-01-01}}\n"
    )
    with pytest.raises(CommandError) as refused:
        apply(path, "ada")
    message = str(refused.value)
    assert "http_tools[a.b].enabled: true or false" in message
    assert "http_tools[a.b].description: a single value" in message
    assert "policies[dated].condition: JSON values only" in message
    assert not HttpTool.objects.exists() and not ApprovalPolicy.objects.exists()


def test_a_directory_applies_its_files_together_and_an_item_declared_in_two_is_refused(people, tmp_path):
    folder = tmp_path / "warden"
    folder.mkdir()
    doc = document()
    write(folder, {"project": "default", "http_tools": doc["http_tools"]}, "tools.yaml")
    write(folder, {**doc, "http_tools": []}, "rules.json")
    assert set(statuses(apply_json(folder, "ada")).values()) == {"created"}
    write(folder, {"project": "default", "http_tools": doc["http_tools"][:1]}, "again.yaml")
    with pytest.raises(CommandError, match=r"default:http_tools\[payments.get_charge\].name: declared twice"):
        apply(folder, "ada", "--dry-run")


def test_the_format_reference_in_the_docs_names_only_real_kinds_and_fields(db):
    """docs/declarations.md shows an item of every kind: each of its fields is one a declaration takes."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "declarations.md").read_text()
    [reference] = [block for block in re.findall(r"```yaml\n(.*?)```", text, re.S) if "waivers:" in block]
    Project.objects.create(slug="payments", name="Payments")
    items = declarations_items([yaml.safe_load(reference)])
    assert {item.kind.key for item in items} == set(ORDER)


def test_an_agents_own_endpoint_is_declared_with_its_keys_grant_checked_and_exported_by_name(people, tmp_path):
    """An agent may call its own OpenAI-compatible endpoint with a key its project was granted: a
    declaration says so as the admin does, the grant checked the same way, the key by name only."""
    agent = {"slug": "local-agent", "name": "Local agent", "provider": "openai", "model": "qwen-7b",
             "base_url": "http://127.0.0.1:8702/v1", "api_key_secret": "DATABASE_URL", "project": "default",
             "send_max_tokens": True}  # fmt: skip
    with pytest.raises(CommandError, match=r"agents\[local-agent\].api_key_secret"):
        apply(write(tmp_path, {"agents": [agent]}), "root")
    assert not Agent.objects.filter(slug="local-agent").exists()
    with pytest.raises(CommandError, match=r"agents\[local-agent\].project: no project 'nowhere'"):
        apply(write(tmp_path, {"agents": [{**agent, "project": "nowhere"}]}), "root")

    granted = {**agent, "api_key_secret": "PAYMENTS_API_KEY"}
    result = apply_json(write(tmp_path, {"agents": [granted]}), "root")
    assert statuses(result) == {"agents[local-agent]": "created"}
    row = Agent.objects.get(slug="local-agent")
    assert (row.base_url, row.api_key_secret, row.project.slug, row.send_max_tokens) == (
        "http://127.0.0.1:8702/v1", "PAYMENTS_API_KEY", "default", True)  # fmt: skip
    out = tmp_path / "exported.yaml"
    call_command("warden_export", "-o", str(out), stderr=open("/dev/null", "w"))
    exported = list(yaml.safe_load_all(out.read_text()))  # the shared configuration, then each project
    (mine,) = [a for doc in exported for a in doc.get("agents", []) if a["slug"] == "local-agent"]
    assert mine["api_key_secret"] == "PAYMENTS_API_KEY" and mine["project"] == "default"
    assert {i["status"] for i in apply_json(out, "root")["items"]} == {"unchanged"}
