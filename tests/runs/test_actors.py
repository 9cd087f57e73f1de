"""Every actor, fed each message twice (and again after the run ends), changes nothing the second time."""

import time

import dramatiq
from django.forms.models import model_to_dict

from integrations.models import WebhookDelivery, WebhookEndpoint
from policy.models import ApprovalRequest
from runs.models import Artifact, Outbox, Run, Span, Task
from runs.services import run_start
from tests.conftest import decide
from tools.models import SandboxCall, ToolOperation


def snapshot(run_ids):
    return {
        "runs": [model_to_dict(r) for r in Run.objects.filter(id__in=run_ids).order_by("id")],
        "tasks": [model_to_dict(t) for t in Task.objects.filter(run_id__in=run_ids).order_by("id")],
        "spans": list(Span.objects.filter(run_id__in=run_ids).order_by("id").values()),
        "artifacts": list(Artifact.objects.filter(run_id__in=run_ids).order_by("id").values()),
        "sandbox": list(SandboxCall.objects.order_by("id").values_list("id", flat=True)),
        "outbox": list(Outbox.objects.order_by("id").values_list("id", flat=True)),
        "ledger": list(ToolOperation.objects.filter(run_id__in=run_ids).order_by("id").values()),
        "webhooks": list(WebhookDelivery.objects.order_by("id").values("id", "status", "attempts", "delivered_at")),
    }


def test_every_actor_fed_each_message_twice_changes_nothing_the_second_time(
    demo_tx, operator, monkeypatch, settings, webhook_receiver
):
    # A duplicate that arrives after the retry is due is the retry itself, not a duplicate: keep the backoff
    # well above the time between the two deliveries, even on a loaded machine.
    settings.WARDEN = {**settings.WARDEN, "RETRY_BASE_SECONDS": 0.6, "RETRY_CAP_SECONDS": 1.2}
    # Every event also goes to a webhook: its deliveries are messages too, and must go out once.
    WebhookEndpoint.objects.create(url=webhook_receiver.url, secret="s3cret")
    sent: list[Outbox] = []
    # Hold messages here instead of a broker, so this test decides what is delivered and when.
    monkeypatch.setattr("runs.services.outbox.outbox_deliver", lambda rows: sent.extend(rows))
    broker = dramatiq.get_broker()
    runs = [
        run_start(workflow="deploy-review"),  # risk's transient failure: a delayed retry message
        run_start(workflow="incident-fanout", input={"faults": [{"task": "worker-3", "call": 2, "mode": "transient"}]}),
        # proposals: the supervisor's executor (run_operations) sends the e-mails after one approval
        run_start(workflow="incident-fanout", input={"propose_tools": ["email.send"]}),
    ]
    run_ids = [r.id for r in runs]
    delivered, covered = [], set()

    def drain():
        while sent:
            message = sent.pop(0)
            time.sleep(message.delay_ms / 1000)
            fn = broker.get_actor(message.actor).fn
            fn(**message.kwargs)
            before, pending = snapshot(run_ids), len(sent)
            fn(**message.kwargs)
            assert snapshot(run_ids) == before, f"second delivery of {message.actor}{message.kwargs} changed the db"
            assert len(sent) == pending, "second delivery sent messages"
            delivered.append(message)
            covered.add(message.actor)

    drain()
    assert Run.objects.get(id=run_ids[2]).status == Run.Status.WAITING_FOR_APPROVAL
    bundle = ApprovalRequest.objects.get(run_id=run_ids[2], kind=ApprovalRequest.Kind.BUNDLE)
    decide(request_id=bundle.id, user=operator, approve=True)
    drain()

    assert [Run.objects.get(id=i).status for i in run_ids] == ["completed", "completed", "completed"]
    # Fed each message twice where what they act on is set up: the judges' actor in
    # tests/evals/test_eval_checks.py::test_a_judge_grades_an_artifact_through_the_gateway_and_its_grade_is_recorded,
    # the breakers' in tests/runs/test_breakers.py and tests/approvals/test_breaker_pages.py ("fed … twice"),
    # the shadows' start and a suite's replay's judges in tests/replay/ ("delivered twice", "fed twice").
    elsewhere = {"grade_eval_result", "resume_parked_tasks", "send_breaker_notifications", "shadow_start",
                 "grade_replay_pair"}  # fmt: skip
    assert covered | elsewhere == set(broker.get_declared_actors()), "an actor was not exercised"
    # Out of order: every message again, after the runs finished.
    before = snapshot(run_ids)
    for message in delivered:
        broker.get_actor(message.actor).fn(**message.kwargs)
    assert snapshot(run_ids) == before
    assert not sent
    deliveries = [r["headers"]["Warden-Delivery"] for r in webhook_receiver.received]
    assert deliveries and len(deliveries) == len(set(deliveries)) == WebhookDelivery.objects.count()
