"""A breaker that opens pages the people who own what it stops (approvals/breaker_pages.py): a project's
own tool's its admins, the deployment's the superusers and the approval webhook (Slack-compatible); once
per opening, written after the commit and sent by a worker, never from the tool call's path."""

import inspect
import json
import types

import pytest
from django.core import mail
from django.utils import timezone

from approvals.actors import send_breaker_notifications
from approvals.breaker_pages import breaker_pages_sweep
from approvals.models import BreakerNotification
from tenancy.access import membership_grant
from tenancy.models import Project
from tests.conftest import WebhookReceiver
from tools.broker import BREAKER

TOOL = "payments.get_charge"


class Clock:
    now = 3_000_000.0

    def time(self):
        return self.now


@pytest.fixture
def people(db, django_user_model, settings, monkeypatch):
    settings.WARDEN = {**settings.WARDEN, "TOOL_CIRCUIT_FAILURES": 2, "TOOL_CIRCUIT_OPEN_SECONDS": 30}
    clock = Clock()
    monkeypatch.setattr("core.circuit.time", types.SimpleNamespace(time=clock.time))
    users = django_user_model.objects
    payments, team_a = (Project.objects.create(slug=s, name=s) for s in ("payments", "team-a"))
    for name, project, role in (("pat", payments, "admin"), ("olga", payments, "operator"),
                                ("mallory", team_a, "admin")):  # fmt: skip
        membership_grant(user=users.create_user(username=name, email=f"{name}@example.test"), project=project,
                         role=role)  # fmt: skip
    users.create_superuser(username="root", password="root-pass-123", email="root@example.test")
    return types.SimpleNamespace(payments=payments, team_a=team_a, clock=clock)


def fail(n, name=TOOL, project_id=None):
    for _ in range(n):
        BREAKER.record(name, False, project_id=project_id)


def test_a_projects_breaker_pages_its_admins_once_per_opening_from_a_worker(
    people, monkeypatch, django_capture_on_commit_callbacks
):
    sent_from = []
    real = __import__("approvals.breaker_pages", fromlist=["_email"])._email

    def email(note):
        sent_from.append({frame.function for frame in inspect.stack()})
        real(note)

    monkeypatch.setattr("approvals.breaker_pages._email", email)
    with django_capture_on_commit_callbacks(execute=True) as announced:
        fail(2, project_id=people.payments.id)
        assert not BreakerNotification.objects.exists()  # nothing written before the commit
    assert announced and sent_from == [] and not mail.outbox  # the commit only handed a message over
    breaker_pages_sweep(timezone.now())  # the sweeper asks a worker again; it sends nothing itself
    assert sent_from == []

    send_breaker_notifications.fn(ids=None)  # what a worker does with the message
    assert len(sent_from) == 1 and not {"breaker_pages_sweep", "_record"} & sent_from[0]
    [page] = mail.outbox
    assert page.to == ["pat@example.test"]  # its project's admins: not its operator, nor team A, nor root
    assert page.subject == f"[Warden] Breaker open: the tool {TOOL} of project payments"
    assert "/inbox/?kind=breaker" in page.body

    # A failed probe opens it again: the same opening, no second page. A new opening after a close: one.
    people.clock.now += 31
    assert BREAKER.admit(TOOL, project_id=people.payments.id) == 0
    with django_capture_on_commit_callbacks(execute=True):
        fail(1, project_id=people.payments.id)
        BREAKER.record(TOOL, True, project_id=people.team_a.id)  # another project's tool: nothing of it
    assert BreakerNotification.objects.count() == 1
    people.clock.now += 31
    with django_capture_on_commit_callbacks(execute=True):
        BREAKER.admit(TOOL, project_id=people.payments.id)
        BREAKER.record(TOOL, True, project_id=people.payments.id)
        fail(2, project_id=people.payments.id)
    send_breaker_notifications.fn(ids=None)
    assert BreakerNotification.objects.count() == 2 and len(mail.outbox) == 2


def test_a_deployment_breaker_pages_the_superusers_and_the_approval_webhook(
    people, settings, django_capture_on_commit_callbacks
):
    receiver = WebhookReceiver()
    settings.WARDEN = {**settings.WARDEN, "APPROVAL_WEBHOOK_URL": receiver.url, "APPROVAL_WEBHOOK_SLACK": True,
                       "APPROVAL_WEBHOOK_SECRET": "hook-secret-123"}  # fmt: skip
    try:
        with django_capture_on_commit_callbacks(execute=True):
            fail(2, "crm.read")
        send_breaker_notifications.fn(ids=None)
        assert [m.to for m in mail.outbox] == [["root@example.test"]]
        [hook] = receiver.received
        body = json.loads(hook["body"])
        assert body["event"] == "breaker.opened" and body["breaker"]["name"] == "crm.read"
        assert body["breaker"]["project"] is None and "The tool crm.read failed 2 times" in body["text"]
        assert hook["headers"]["webhook-signature"].startswith("v1,")
    finally:
        receiver.stop()
    assert set(BreakerNotification.objects.values_list("channel", flat=True)) == {"email", "webhook"}


def test_a_projects_breaker_never_goes_to_the_deployments_webhook(people, settings, django_capture_on_commit_callbacks):
    settings.WARDEN = {**settings.WARDEN, "APPROVAL_WEBHOOK_URL": "http://127.0.0.1:9/hook"}
    with django_capture_on_commit_callbacks(execute=True):
        fail(2, project_id=people.payments.id)
    assert list(BreakerNotification.objects.values_list("channel", flat=True)) == ["email"]


def test_the_sweeper_writes_the_pages_of_an_opening_whose_announcement_was_lost(people):
    fail(2, project_id=people.payments.id)  # this test's transaction never commits: nobody heard it
    assert not BreakerNotification.objects.exists()
    assert breaker_pages_sweep(timezone.now())["breaker_pages_written"] == 1
    assert breaker_pages_sweep(timezone.now())["breaker_pages_written"] == 0  # once
    send_breaker_notifications.fn(ids=None)
    assert [m.to for m in mail.outbox] == [["pat@example.test"]]


def test_the_pages_actor_fed_its_message_twice_sends_each_page_once(people, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        fail(2, project_id=people.payments.id)
    ids = list(BreakerNotification.objects.values_list("id", flat=True))
    send_breaker_notifications.fn(ids=ids)
    send_breaker_notifications.fn(ids=ids)  # at least once delivery: the same message again
    assert len(mail.outbox) == 1 and BreakerNotification.objects.filter(sent_at__isnull=False).count() == 1
