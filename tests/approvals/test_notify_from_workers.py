"""Reviewers' notifications leave from a worker: never from a commit hook (a worker's step would wait on
the mail server) nor from the recovery sweeper's pass (a hanging mail server would stall recovery)."""

import inspect

from django.core import mail

from approvals.actors import send_notifications
from approvals.models import Notification
from approvals.notify import notifications_add
from policy.models import ApprovalRequest
from runs.services import run_start
from runs.services.recovery import sweep_once


def test_a_notification_is_sent_by_the_worker_and_only_asked_for_elsewhere(
    demo, operator, monkeypatch, django_capture_on_commit_callbacks
):
    operator.email = "olivia@example.test"
    operator.save(update_fields=["email"])
    sent_from = []
    real = __import__("approvals.notify", fromlist=["_email"])._email

    def email(note):
        sent_from.append({frame.function for frame in inspect.stack()})
        real(note)

    monkeypatch.setattr("approvals.notify._email", email)
    run = run_start(workflow="deploy-review")
    request = ApprovalRequest.objects.create(run=run, kind=ApprovalRequest.Kind.OPERATION, summary="send the e-mail")
    with django_capture_on_commit_callbacks(execute=True):
        notifications_add(request, kind=Notification.Kind.NEW)
    assert sent_from == [] and not mail.outbox  # the commit only handed a message to the broker

    sweep_once()  # the sweeper sees it waiting and asks again; it sends nothing itself
    assert sent_from == [] and Notification.objects.filter(sent_at__isnull=True).count() == 1

    send_notifications.fn(ids=None)  # what a worker does with the message
    assert len(sent_from) == 1 and not {"sweep_once", "run_and_clear_commit_hooks"} & sent_from[0]
    assert [m.to for m in mail.outbox] == [["olivia@example.test"]]
    assert Notification.objects.filter(sent_at__isnull=True).count() == 0
