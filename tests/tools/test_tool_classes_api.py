"""The endpoints issue 13 added or changed, with bad input: a clear 4xx in the API's one error shape, and
nothing written."""

import pytest
from django.utils import timezone

from approvals.models import AllowRule
from tenancy.access import default_project
from tenancy.models import AuditEvent
from tests.tools.test_ledger_api import member
from tools.models import ToolClassification

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
    changed = admin("post", "/tool-classes", {**GOOD, "tool_class": "read_only", "reversibility": ""})
    assert changed.json()["tool_class"] == "read_only" and ToolClassification.objects.count() == 1
    event = AuditEvent.objects.filter(action="tool_classify").order_by("id").last()
    assert event.detail["before"]["tool_class"] == "non_idempotent_write" and event.via == "api"
    assert [row["tool"] for row in admin("get", "/tool-classes").json()] == ["crm.note"]
    stranger = member(client, "sly", "viewer", project=default_project().__class__.objects.create(slug="o", name="o"))
    assert stranger("get", "/tool-classes").json() == []


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
