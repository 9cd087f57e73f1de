"""The endpoints issue 13 added or changed, with bad input: a clear 4xx in the API's one error shape, and
nothing written."""

import pytest
from django.utils import timezone

from policy.models import AllowRule
from tenancy.access import default_project
from tenancy.models import AuditEvent, ChangeRequest, Project
from tests.tools.test_ledger_api import member
from tools.models import HttpTool, ToolClassification

GOOD = {"project": "default", "tool": "crm.note", "tool_class": "non_idempotent_write", "reversibility": "irreversible"}


@pytest.fixture
def admin(demo, client):
    return member(client, "ada", "admin", scopes=["read", "admin", "approve"])


def test_a_project_admin_classifies_a_tool_and_lists_it(admin, client):
    created = admin("post", "/tool-classes", {**GOOD, "approval": "always", "note": "writes notes"})
    assert created.status_code == 200, created.json()
    assert created.json() | {"classified_at": None} == {
        **GOOD, "approval": "always", "note": "writes notes", "classified_by": "ada", "classified_at": None
    }  # fmt: skip
    stricter = admin("post", "/tool-classes", {**GOOD, "approval": "refuse"})  # tightening: at once
    assert stricter.status_code == 200 and stricter.json()["approval"] == "refuse"
    event = AuditEvent.objects.filter(action="tool_classify").order_by("id").last()
    assert event.detail["before"]["approval"] == "always" and event.via == "api"
    assert [row["tool"] for row in admin("get", "/tool-classes").json()] == ["crm.note"]
    stranger = member(client, "sly", "viewer", project=default_project().__class__.objects.create(slug="o", name="o"))
    assert stranger("get", "/tool-classes").json() == []


def test_a_lowering_waits_for_a_second_admin_who_applies_it(admin, client):
    """Four eyes on the rules (issue 25): one admin's lowering is a change request, nothing changes until
    another admin of the project approves it; the asker cannot approve it."""
    assert admin("post", "/tool-classes", GOOD).status_code == 200
    asked = admin("post", "/tool-classes", {**GOOD, "tool_class": "read_only", "reversibility": ""})
    assert asked.status_code == 202, asked.json()
    change = asked.json()
    assert change["status"] == "pending", change
    assert change["loosens"] == [
        "its class is lowered from non_idempotent_write to read_only",
        "its reversibility is lowered from irreversible to none (a read)",
    ]
    assert ToolClassification.objects.get().tool_class == "non_idempotent_write"  # nothing changed yet
    own = admin("post", f"/change-requests/{change['id']}/decision", {"decision": "approve"})
    assert own.status_code == 403 and "four eyes" in own.json()["message"]
    reviewer = member(client, "rita", "reviewer", scopes=["read", "approve", "admin"])
    assert reviewer("post", f"/change-requests/{change['id']}/decision", {"decision": "approve"}).status_code == 403
    second = member(client, "abe", "admin", scopes=["read", "admin"])
    assert [c["id"] for c in second("get", "/change-requests").json()] == [change["id"]]
    applied = second("post", f"/change-requests/{change['id']}/decision", {"decision": "approve", "note": "ok"})
    assert applied.status_code == 200 and applied.json()["status"] == "applied", applied.json()
    assert ToolClassification.objects.get().tool_class == "read_only"
    event = AuditEvent.objects.filter(action="tool_classify").order_by("id").last()
    assert event.actor_label == "abe" and event.detail["asked_by"] == "ada" and event.detail["change_request"]
    again = second("post", f"/change-requests/{change['id']}/decision", {"decision": "approve"})
    assert again.status_code == 409


def test_a_change_request_is_nobody_elses_business(admin, client):
    admin("post", "/tool-classes", GOOD)
    change = admin("post", "/tool-classes", {**GOOD, "approval": "", "tool_class": "idempotent_write"}).json()
    elsewhere = Project.objects.create(slug="rival", name="Rival")
    rival = member(client, "mallory", "admin", scopes=["read", "admin"], project=elsewhere)
    assert rival("get", "/change-requests").json() == []
    for method, path, body in [
        ("get", f"/change-requests/{change['id']}", None),
        ("post", f"/change-requests/{change['id']}/decision", {"decision": "approve"}),
        ("post", f"/change-requests/{change['id']}/withdraw", {}),
    ]:
        response = rival(method, path, body) if body is not None else rival(method, path)
        assert response.status_code == 404, (path, response.json())
    assert rival("get", "/change-requests/999999").status_code == 404
    assert ChangeRequest.objects.get().status == "pending"
    assert admin("post", f"/change-requests/{change['id']}/withdraw", {}).json()["status"] == "withdrawn"


@pytest.mark.parametrize("body", [{"decision": "maybe"}, {"decision": "reject"}, {"decision": "approve", "x": 1}])
def test_a_bad_decision_of_a_change_request_is_refused_and_changes_nothing(admin, client, body):
    admin("post", "/tool-classes", GOOD)
    change = admin("post", "/tool-classes", {**GOOD, "tool_class": "idempotent_write"}).json()
    second = member(client, "abe", "admin", scopes=["read", "admin"])
    response = second("post", f"/change-requests/{change['id']}/decision", body)
    assert response.status_code == 422 and set(response.json()) == {"code", "message", "errors"}, response.json()
    assert ChangeRequest.objects.get().status == "pending"
    assert ToolClassification.objects.get().tool_class == "non_idempotent_write"


def test_a_classification_never_lowers_a_declared_http_tool(admin):
    """Issue 25, finding 6: POST /api/v1/tool-classes stored a lowering of an HTTP tool (and GET listed
    it) although the gate ignored it. Now it is refused with the field, and nothing is stored."""
    HttpTool.objects.create(project=default_project(), name="payments.refund", method="POST",
                            url="http://127.0.0.1:1/refunds", arguments_schema={"type": "object"},
                            tool_class="non_idempotent_write", reversibility="irreversible")  # fmt: skip
    body = {"project": "default", "tool": "payments.refund", "tool_class": "read_only", "reversibility": ""}
    response = admin("post", "/tool-classes", body)
    assert response.status_code == 422, response.json()
    assert response.json()["errors"][0]["field"].endswith("tool_class")
    assert "can only make it stricter" in response.json()["errors"][0]["message"]
    assert not ToolClassification.objects.exists() and admin("get", "/tool-classes").json() == []
    stricter = admin("post", "/tool-classes", {**body, "tool_class": "non_idempotent_write",
                                               "reversibility": "irreversible", "approval": "always"})  # fmt: skip
    assert stricter.status_code == 200


def test_an_unknown_project_and_anothers_answer_alike(admin):
    Project.objects.create(slug="hidden", name="Hidden")
    unknown = admin("post", "/tool-classes", {**GOOD, "project": "nowhere"})
    hidden = admin("post", "/tool-classes", {**GOOD, "project": "hidden"})
    assert unknown.status_code == hidden.status_code == 404
    assert unknown.json()["message"].replace("nowhere", "?") == hidden.json()["message"].replace("hidden", "?")


@pytest.mark.parametrize(
    "body,field",
    [
        ({**GOOD, "tool_class": "harmless"}, "tool_class"),
        ({**GOOD, "reversibility": "mostly"}, "reversibility"),
        ({**GOOD, "tool_class": "read_only"}, "reversibility"),  # a read with a reversibility
        ({**GOOD, "reversibility": ""}, "reversibility"),  # a write that says nothing of its undo
        ({**GOOD, "tool": "email.send"}, "tool"),  # the registry's own
        ({**GOOD, "tool": "two words"}, "tool"),
        ({**GOOD, "tool": ""}, "tool"),
        ({**GOOD, "approval": "sometimes"}, "approval"),
        ({k: v for k, v in GOOD.items() if k != "tool_class"}, "tool_class"),
        ({**GOOD, "extra": 1}, "extra"),
    ],
)
def test_a_bad_classification_is_refused_with_the_field_and_writes_nothing(admin, body, field):
    response = admin("post", "/tool-classes", body)
    assert response.status_code == 422, response.json()
    assert set(response.json()) == {"code", "message", "errors"}
    assert field in {e["field"].split(".")[-1] for e in response.json()["errors"]}, response.json()
    assert not ToolClassification.objects.exists()


def test_an_unknown_project_is_404_and_writes_nothing(admin):
    response = admin("post", "/tool-classes", {**GOOD, "project": "nowhere"})
    assert response.status_code == 404 and not ToolClassification.objects.exists()


@pytest.mark.parametrize(
    "expires_at,ok",
    [
        (None, True),
        (lambda now: now + timezone.timedelta(days=2), True),
        (lambda now: now - timezone.timedelta(minutes=1), False),
        (lambda now: now + timezone.timedelta(days=31), False),
        ("next tuesday", False),
    ],
)
def test_an_allow_rule_ends_within_the_longest_lifetime(admin, expires_at, ok):
    now = timezone.now()
    body = {"project": "default", "tool": "tickets.create"}
    if expires_at is not None:
        body["expires_at"] = expires_at(now).isoformat() if callable(expires_at) else expires_at
    response = admin("post", "/allow-rules", body)
    if ok:
        assert response.status_code == 201, response.json()
        rule = AllowRule.objects.get()
        assert now < rule.expires_at <= now + timezone.timedelta(days=30, seconds=5)
        assert response.json()["expires_at"] is not None
    else:
        assert response.status_code == 422 and set(response.json()) == {"code", "message", "errors"}
        assert not AllowRule.objects.exists()
