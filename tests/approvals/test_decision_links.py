"""Signed one-time decision links in the reviewers' e-mail and chat notifications: the link opens the
card after login (a GET decides nothing), decides once, and is dead once used, decided, expired or forged."""

import re
import time
from unittest import mock

import pytest
from django.core import mail
from django.db import transaction
from django.test import Client
from django.utils import timezone

from approvals.actors import send_notifications
from approvals.links import decision_link
from approvals.models import DecisionLink
from policy.models import ApprovalRequest
from runs.models import Run
from runs.services import run_start
from tenancy.access import default_project, membership_grant
from tenancy.models import Project
from tests.conftest import wait_for


@pytest.fixture
def proposal(demo_tx, worker, django_user_model):
    users = django_user_model.objects
    starter = users.create_user(username="olivia", password="olivia-pass-1234")
    rita = users.create_user(username="rita", password="rita-pass-1234", email="rita@example.test")
    membership_grant(user=starter, project=default_project(), role="operator")
    membership_grant(user=rita, project=default_project(), role="reviewer")
    run = run_start(workflow="incident-fanout", input={"propose_tools": ["email.send"]}, started_by=starter)
    wait_for(lambda: Run.objects.get(id=run.id).status == "waiting_for_approval", timeout=60, message="proposals")
    return run, rita, starter


def _mailed():
    """The reviewer's e-mail, sent by a worker (this process's, or here as a worker does)."""
    send_notifications.fn(ids=None)
    return wait_for(lambda: [m for m in mail.outbox if "Approval needed" in m.subject], message="the e-mail")[0]


def _link(text: str) -> str:
    return re.search(r"(/approvals/link/\S+)", text).group(1)


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_mailed_link_opens_the_card_after_login_and_decides_once(proposal):
    run, rita, _ = proposal
    message = _mailed()
    assert message.to == ["rita@example.test"] and "this link decides once" in message.body
    path = _link(message.body)
    anonymous = Client().get(path)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/")

    client = _client(rita)
    page = client.get(path)
    assert page.status_code == 200 and 'value="approve"' in page.content.decode()
    assert ApprovalRequest.objects.get(run=run, parent=None).status == "pending"  # opening decided nothing
    decided = client.post(path, {"decision": "approve"})
    assert decided.status_code == 200 and "Approved by rita" in decided.content.decode()
    wait_for(lambda: Run.objects.get(id=run.id).status == "completed", timeout=60, message="the run")
    link = DecisionLink.objects.get()
    assert link.used_by == rita and link.used_at is not None
    again = client.post(path, {"decision": "reject", "note": "changed my mind"})
    assert again.status_code == 409 and "decides once" in again.content.decode()
    assert ApprovalRequest.objects.get(run=run, parent=None).status == "approved"


def test_a_forged_or_foreign_link_decides_nothing(proposal, django_user_model):
    run, rita, starter = proposal
    path = _link(_mailed().body)
    forged = path[:-3] + ("aaa" if not path.endswith("aaa") else "bbb")
    assert _client(rita).get(forged).status_code == 404
    assert _client(rita).post(forged, {"decision": "approve"}).status_code == 404
    # The run's starter holds the link but may not decide (separation of duties); a member of another
    # project learns nothing of it.
    refused = _client(starter).post(path, {"decision": "approve"})
    assert refused.status_code == 403
    outsider = django_user_model.objects.create_user(username="otto", password="otto-pass-1234")
    membership_grant(user=outsider, project=Project.objects.create(slug="elsewhere", name="E"), role="admin")
    assert _client(outsider).post(path, {"decision": "approve"}).status_code == 404
    assert ApprovalRequest.objects.get(run=run, parent=None).status == "pending"
    assert DecisionLink.objects.get().used_at is None


def test_a_link_dies_with_its_request(proposal):
    run, rita, _ = proposal
    path = _link(_mailed().body)
    with transaction.atomic():  # expired for this request only: the expiry sweeper never sees it
        ApprovalRequest.objects.filter(run=run, parent=None).update(expires_at=timezone.now())
        page = _client(rita).post(path, {"decision": "approve"})
        assert ApprovalRequest.objects.get(run=run, parent=None).status == "pending"
    assert page.status_code == 409 and "has expired" in page.content.decode()


def _outsider(django_user_model):
    """An admin of another project: a member somewhere, of nothing this link is about."""
    otto = django_user_model.objects.create_user(username="otto", password="otto-pass-1234")
    membership_grant(user=otto, project=Project.objects.create(slug="elsewhere", name="E"), role="admin")
    return _client(otto)


def test_a_non_member_gets_the_same_404_whatever_state_the_link_is_in(proposal, django_user_model):
    run, rita, _ = proposal
    path = _link(_mailed().body)
    top = ApprovalRequest.objects.get(run=run, parent=None)
    with mock.patch("django.core.signing.time.time", return_value=time.time() - 15 * 86400):
        aged = _link(decision_link(top))  # signed 15 days ago: past LINK_MAX_AGE_DAYS
    outsider = _outsider(django_user_model)
    tampered = path[:-3] + ("aaa" if not path.endswith("aaa") else "bbb")
    answers = {"tampered": (outsider.get(tampered), outsider.post(tampered, {"decision": "approve"}))}
    answers["valid"] = (outsider.get(path), outsider.post(path, {"decision": "approve"}))
    answers["aged"] = (outsider.get(aged), outsider.post(aged, {"decision": "approve"}))
    assert _client(rita).get(aged).status_code == 409  # a member is told why it is dead
    with transaction.atomic():  # expired for the outsider's requests only: the sweeper never sees it
        ApprovalRequest.objects.filter(id=top.id).update(expires_at=timezone.now())
        answers["request expired"] = (outsider.get(path), outsider.post(path, {"decision": "approve"}))
        ApprovalRequest.objects.filter(id=top.id).update(expires_at=None)

    assert _client(rita).post(path, {"decision": "approve"}).status_code == 200
    answers["spent"] = (outsider.get(path), outsider.post(path, {"decision": "reject", "note": "no"}))
    fresh = _link(decision_link(top))
    answers["request decided"] = (outsider.get(fresh), outsider.post(fresh, {"decision": "approve"}))

    expected = answers["tampered"][0].content
    seen = {state: [(page.status_code, page.content) for page in pages] for state, pages in answers.items()}
    assert seen == {state: [(404, expected)] * 2 for state in answers}
    assert b"used at" not in expected and str(top.id).encode() not in expected
    assert list(DecisionLink.objects.filter(used_at__isnull=False).values_list("used_by", flat=True)) == [rita.id]
