"""The reviewer queue's pages, from the server's side: who sees what, escaping, decisions in place."""

import re

import pytest
from django.urls import reverse

from policy.models import ApprovalPolicy, ApprovalRequest
from runs.models import Run
from runs.services import run_start
from tenancy.access import default_project, membership_grant
from tenancy.models import Project
from tests.conftest import wait_for
from tests.runs.test_engine import scripted_workflow

EVIL = "<script>alert('owned')</script>"


@pytest.fixture
def waiting(demo_tx, worker, django_user_model):
    """Two runs whose e-mails wait for a reviewer; the agent's stated reason carries markup."""
    ApprovalPolicy.objects.create(name="mail", tool="email.send")
    script = [
        {
            "say": f"Telling the customer {EVIL}",
            "tool": "email.send",
            "arguments": {"to": "a@x.example", "subject": f"Hi {EVIL}", "body": "b"},
        },
        {"final": {"outcome": "{last}"}},
    ]
    wf = scripted_workflow("mailer", script, tools=["email.send"])
    runs = [run_start(workflow=wf.slug) for _ in range(2)]
    wait_for(lambda: ApprovalRequest.objects.filter(status="pending").count() == 2, message="two requests")
    rita = django_user_model.objects.create_user(username="rita", password="rita-pass-123")
    membership_grant(user=rita, project=default_project(), role="reviewer")
    return runs, rita


def test_anonymous_users_are_sent_to_the_login_page(db, client):
    response = client.get(reverse("approvals-queue"))
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_a_reviewer_sees_the_pending_requests_of_their_projects_oldest_first_escaped(waiting, client):
    runs, rita = waiting
    client.force_login(rita)
    page = client.get(reverse("approvals-queue")).content.decode()
    ids = [int(i) for i in re.findall(r'id="request-(\d+)"', page)]
    # Two workers may stamp requested_at out of id order: oldest first means by requested_at.
    assert ids == list(ApprovalRequest.objects.order_by("requested_at", "id").values_list("id", flat=True))
    assert len(ids) == 2
    assert EVIL not in page and "&lt;script&gt;" in page  # model output is data
    assert "Telling the customer" in page and "email.send" in page and "irreversible" in page


def test_a_member_of_another_project_sees_nothing(waiting, client, django_user_model):
    outsider = django_user_model.objects.create_user(username="otto", password="otto-pass-123")
    membership_grant(user=outsider, project=Project.objects.create(slug="other", name="Other"), role="admin")
    client.force_login(outsider)
    page = client.get(reverse("approvals-queue")).content.decode()
    assert "request-" not in page and "Nothing is waiting for you" in page
    request = ApprovalRequest.objects.first()
    body = {"decision": "approve", "arguments_hash": request.arguments_hash}
    response = client.post(reverse("approvals-decide", args=[request.id]), body)
    assert response.status_code == 404 and "does not exist" in response.content.decode()
    # Nothing of the request: not its tool, its arguments, its run or the agent's reason.
    text = response.content.decode()
    assert "email.send" not in text and f"/runs/{request.run_id}/" not in text and request.summary not in text
    assert ApprovalRequest.objects.get(id=request.id).status == "pending"


def test_decisions_in_place_check_the_hash_and_the_comment(waiting, client):
    runs, rita = waiting
    client.force_login(rita)
    first, second = ApprovalRequest.objects.order_by("id")
    url = reverse("approvals-decide", args=[first.id])
    stale = client.post(url, {"decision": "approve", "arguments_hash": "0" * 64}).content.decode()
    assert "changed since you saw them" in stale and ApprovalRequest.objects.get(id=first.id).status == "pending"
    no_comment = client.post(url, {"decision": "reject", "arguments_hash": first.arguments_hash}).content.decode()
    assert "needs a comment" in no_comment
    done = client.post(url, {"decision": "approve", "arguments_hash": first.arguments_hash}).content.decode()
    assert "Approved by rita" in done and ApprovalRequest.objects.get(id=first.id).status == "approved"
    newer = client.get(reverse("approvals-new"), {"after": first.id}).content.decode()
    assert f'id="request-{second.id}"' in newer and f'id="request-{first.id}"' not in newer
    wait_for(lambda: Run.objects.get(id=first.run_id).status == Run.Status.COMPLETED, message="the approved run")


def test_a_queue_opened_before_the_role_was_removed_decides_nothing(waiting, client):
    runs, rita = waiting
    client.force_login(rita)
    page = client.get(reverse("approvals-queue")).content.decode()
    request = ApprovalRequest.objects.order_by("id").first()
    assert f'id="request-{request.id}"' in page
    rita.memberships.update(role="viewer")
    response = client.post(
        reverse("approvals-decide", args=[request.id]),
        {"decision": "approve", "arguments_hash": request.arguments_hash},
    ).content.decode()
    assert "may not decide" in response and ApprovalRequest.objects.get(id=request.id).status == "pending"
