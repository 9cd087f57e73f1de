"""Outbound webhooks: each event reaches the receiver once, signed; a failing receiver is retried with
backoff; nothing is lost when the worker that should send is gone."""

import json
import os
import signal
import time

import pytest
from django.utils import timezone
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from approvals.services import approval_decide
from integrations.models import WebhookDelivery, WebhookEndpoint
from integrations.webhooks import signature, signature_valid, webhook_redeliver
from runs.models import Run
from runs.services import run_start
from tests.conftest import wait_for

SECRET = "whsec-test-1"


def test_each_event_arrives_once_and_signed(demo_tx, operator, worker, webhook_receiver, django_user_model):
    from tenancy.access import default_project, membership_grant

    WebhookEndpoint.objects.create(url=webhook_receiver.url, secret=SECRET)
    run = run_start(workflow="incident-fanout", input={"propose_tools": ["email.send"]}, started_by=operator)
    wait_for(lambda: Run.objects.get(id=run.id).status == "waiting_for_approval", timeout=60, message="the bundle")
    reviewer = django_user_model.objects.create_user(username="rita", password="x")
    membership_grant(user=reviewer, project=default_project(), role="reviewer")
    bundle = run.approvals.get(parent=None)
    approval_decide(request_id=bundle.id, user=reviewer, approve=True, seen_hash=bundle.arguments_hash)
    wait_for(lambda: Run.objects.get(id=run.id).status == "completed", timeout=60, message="the run")
    wait_for(lambda: len(webhook_receiver.received) >= 3, timeout=30, message="three deliveries")
    time.sleep(0.5)  # anything more would be a duplicate

    assert webhook_receiver.events() == ["approval.requested", "approval.decided", "run.finished"]
    for request in webhook_receiver.received:
        headers, body = request["headers"], request["body"]
        assert signature_valid(SECRET, headers["Warden-Signature"], body)
        assert not signature_valid("another secret", headers["Warden-Signature"], body)
        assert not signature_valid(SECRET, headers["Warden-Signature"], body + b" ")
        # The Standard Webhooks signature, checked with the spec's own library as a receiver would.
        assert Webhook(SECRET.encode()).verify(body, headers)["id"] == int(headers["Warden-Delivery"])
        with pytest.raises(WebhookVerificationError):
            Webhook(b"another secret").verify(body, headers)
        with pytest.raises(WebhookVerificationError):
            Webhook(SECRET.encode()).verify(body + b" ", headers)
        assert headers["webhook-id"] == f"msg_delivery_{headers['Warden-Delivery']}"
        payload = json.loads(body)
        assert payload["id"] == int(headers["Warden-Delivery"]) and payload["data"]["run"] == run.id
    last = max(webhook_receiver.received, key=lambda r: int(r["headers"]["Warden-Delivery"]))
    finished = json.loads(last["body"])["data"]
    assert finished["status"] == "completed" and finished["url"].endswith(f"/runs/{run.id}/")
    assert set(WebhookDelivery.objects.values_list("status", flat=True)) == {"delivered"}


def test_a_receiver_that_fails_twice_gets_the_third_try(demo_tx, operator, worker, webhook_receiver):
    webhook_receiver.fail_first = 2
    WebhookEndpoint.objects.create(url=webhook_receiver.url, secret=SECRET, events=["run.needs_attention"])
    run = run_start(workflow="incident-fanout", input={"faults": [{"task": "worker-3", "call": 4, "mode": "error"}]})
    wait_for(lambda: WebhookDelivery.objects.filter(status="delivered").exists(), timeout=60, message="a delivery")
    delivery = WebhookDelivery.objects.get()
    assert delivery.event == "run.needs_attention" and delivery.attempts == 3
    assert len(webhook_receiver.received) == 3
    assert len({r["headers"]["Warden-Delivery"] for r in webhook_receiver.received}) == 1  # one delivery, retried
    assert Run.objects.get(id=run.id).status == "needs_attention"


def test_a_delivery_whose_message_was_lost_is_sent_by_the_sweeper(demo_tx, operator, webhook_receiver, settings):
    """No worker was there when the run needed attention (the outbox message went nowhere): the next
    worker's sweeper finds the overdue delivery and sends it, once."""
    import dramatiq

    from integrations.webhooks import webhook_deliver
    from runs.services.recovery import sweep_once

    WebhookEndpoint.objects.create(url=webhook_receiver.url, secret=SECRET)
    run = run_start(workflow="deploy-review")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("runs.services.outbox.outbox_deliver", lambda rows: None)  # the broker is unreachable
        from runs.services.runs import run_transition

        with __import__("django").db.transaction.atomic():
            locked = Run.objects.select_for_update().get(id=run.id)
            run_transition(run=locked, to=Run.Status.NEEDS_ATTENTION, reason="drill")
    delivery = WebhookDelivery.objects.get()
    WebhookDelivery.objects.filter(id=delivery.id).update(next_attempt_at=timezone.now() - timezone.timedelta(hours=1))
    broker = dramatiq.get_broker()
    sent = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("runs.services.outbox.outbox_deliver", lambda rows: sent.extend(rows))
        assert sweep_once()["webhooks_redriven"] == 1
    for message in sent:
        if message.actor == "deliver_webhook":
            broker.get_actor(message.actor).fn(**message.kwargs)
            webhook_deliver(**message.kwargs)  # the message again: already delivered, nothing sent
    assert webhook_receiver.events() == ["run.needs_attention"]
    assert WebhookDelivery.objects.get().status == "delivered"


def test_the_admin_can_send_a_delivery_again(demo_tx, operator, webhook_receiver):
    from integrations.webhooks import webhook_deliver

    endpoint = WebhookEndpoint.objects.create(url=webhook_receiver.url, secret=SECRET)
    delivery = WebhookDelivery.objects.create(
        endpoint=endpoint, event="run.finished", payload={"event": "run.finished", "data": {}},
        status="failed", attempts=8, next_attempt_at=timezone.now(),
    )  # fmt: skip
    assert webhook_deliver(delivery_id=delivery.id) is False  # given up: not sent
    webhook_redeliver(delivery_id=delivery.id)
    assert webhook_deliver(delivery_id=delivery.id) is True
    delivery.refresh_from_db()
    assert delivery.status == "delivered" and delivery.attempts == 1 and len(webhook_receiver.received) == 1


def test_signatures_refuse_old_timestamps():
    body = b'{"event": "run.finished"}'
    old = str(int(time.time()) - 3600)
    assert not signature_valid(SECRET, f"t={old},v1={signature(SECRET, old, body)}", body)
    now = str(int(time.time()))
    assert signature_valid(SECRET, f"t={now},v1={signature(SECRET, now, body)}", body)
    assert not signature_valid(SECRET, "v1=deadbeef", body)


@pytest.mark.services
@pytest.mark.processes
def test_nothing_is_lost_when_the_worker_is_killed_mid_post(demo_tx, processes, webhook_receiver):
    """A real worker is SIGKILLed while it posts (the receiver holds the request), more events happen while
    no worker runs, and a fresh worker delivers every one: the one caught mid-post again, under its id."""
    from django.db import transaction

    from integrations.webhooks import webhook_emit

    def emit(count):
        with transaction.atomic():
            for _ in range(count):
                webhook_emit(event="run.finished", project_id=None, data={"run": 0})

    webhook_receiver.hold_first = 1
    WebhookEndpoint.objects.create(url=webhook_receiver.url, secret=SECRET)
    first = processes.worker(threads=1, WARDEN_WEBHOOK_TIMEOUT_SECONDS=60)  # it waits on the held post
    emit(3)
    wait_for(lambda: webhook_receiver.received, timeout=30, message="the first post")
    held = webhook_receiver.delivery_ids()[0]
    assert WebhookDelivery.objects.get(id=held).status == "sending"
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=10)
    webhook_receiver.release.set()
    emit(2)  # while no worker runs

    processes.worker(threads=1, WARDEN_WEBHOOK_TIMEOUT_SECONDS=1)  # a dead sender's claim is stale after 4 s
    wait_for(
        lambda: set(WebhookDelivery.objects.values_list("status", flat=True)) == {"delivered"},
        timeout=60,
        message="every delivery",
    )
    every = set(WebhookDelivery.objects.values_list("id", flat=True))
    received = webhook_receiver.delivery_ids()
    assert len(every) == 5 and set(received) == every
    # At least once, never more than needed: only the post the kill interrupted was sent twice.
    assert sorted(received) == sorted([*every, held])
    for request in webhook_receiver.received:
        assert signature_valid(SECRET, request["headers"]["Warden-Signature"], request["body"])


def test_a_run_that_ends_with_no_endpoint_active_builds_no_payload(demo, monkeypatch):
    """The common case, at the end of every run: one cheap statement and nothing else. The payload's run
    URL is reversed through the URLconf, whose first load cost each worker process ~0.2 s of CPU inside
    the engine benchmark's measurement (its CPU per step went from 0.26 to 0.48 ms)."""
    from core import links
    from runs.services import run_cancel

    built = []
    monkeypatch.setattr(links, "run_url", lambda run_id: built.append(run_id) or f"/runs/{run_id}/")
    WebhookEndpoint.objects.create(url="http://127.0.0.1:9/hook", secret=SECRET, active=False)
    run = run_start(workflow="deploy-review")

    run_cancel(run_id=run.id, reason="no endpoint is listening")

    assert Run.objects.get(id=run.id).status in ("cancelling", "cancelled")
    assert built == [] and not WebhookDelivery.objects.exists()

    WebhookEndpoint.objects.update(active=True)
    second = run_start(workflow="deploy-review")
    run_cancel(run_id=second.id, reason="now one is")
    delivered = WebhookDelivery.objects.filter(event="run.finished").values_list("payload", flat=True)
    assert built == [second.id] and [p["data"]["url"] for p in delivered] == [f"/runs/{second.id}/"]
