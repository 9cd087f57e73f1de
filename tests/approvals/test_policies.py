"""Approval policies from the admin: which calls they gate, expiry (reject, or escalate once), reminders,
what a rejection does to the task, and notifications sent once per request by e-mail and signed webhook."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core import mail
from standardwebhooks import Webhook

from approvals.models import Notification
from approvals.notify import signature
from policy.models import ApprovalPolicy, ApprovalRequest
from runs.models import Artifact, Run, Task
from runs.services import run_start
from runs.services.recovery import sweep_once
from tenancy.access import default_project, membership_grant
from tenancy.models import AuditEvent
from tests.conftest import decide, free_port, wait_for
from tests.runs.test_engine import scripted_workflow
from tools.models import SandboxCall, ToolOperation

REFUND = {"to": "a@x.example", "subject": "Refund issued", "body": "b"}
NEWS = {"to": "a@x.example", "subject": "Newsletter", "body": "b"}


def two_mails(slug="mailer"):
    script = [
        {"tool": "email.send", "arguments": REFUND},
        {"tool": "email.send", "arguments": NEWS},
        {"final": {"outcome": "{last}"}},
    ]
    return scripted_workflow(slug, script, tools=["email.send"])


def completed(run, timeout=20):
    wait_for(
        lambda: Run.objects.get(id=run.id).is_terminal or Run.objects.get(id=run.id).status == "needs_attention",
        timeout=timeout,
        message=f"run {run.id} to end",
    )
    run.refresh_from_db()
    return run


def sent_subjects():
    return sorted(c.arguments["subject"] for c in SandboxCall.objects.filter(tool="email.send", is_effect=True))


@pytest.fixture
def reviewer(django_user_model):
    user = django_user_model.objects.create_user(username="rita", password="rita-pass-123", email="rita@x.example")
    membership_grant(user=user, project=default_project(), role="reviewer")
    boss = django_user_model.objects.create_user(username="ada", password="ada-pass-123", email="ada@x.example")
    membership_grant(user=boss, project=default_project(), role="admin")
    return user


def test_a_policy_with_a_condition_gates_only_the_calls_it_matches(demo_tx, worker, reviewer):
    ApprovalPolicy.objects.create(
        name="refunds need a reviewer",
        tool="email.send",
        condition={"field": "subject", "op": "==", "value": "Refund issued"},
    )
    run = run_start(workflow=two_mails().slug)
    wait_for(lambda: ApprovalRequest.objects.filter(run=run).exists(), message="the refund's request")
    assert sent_subjects() == [] and "Refund issued" in ApprovalRequest.objects.get(run=run).summary
    decide(request_id=ApprovalRequest.objects.get(run=run).id, user=reviewer, approve=True)
    assert completed(run).status == Run.Status.COMPLETED
    assert sent_subjects() == ["Newsletter", "Refund issued"]  # the newsletter never waited
    assert ApprovalRequest.objects.filter(run=run).count() == 1


def test_expiry_rejects_the_call_and_the_agent_is_told(demo_tx, worker, reviewer):
    ApprovalPolicy.objects.create(name="quick", tool="email.send", expires_after_seconds=1, remind_before_seconds=1)
    run = completed(run_start(workflow=two_mails().slug))
    assert run.status == Run.Status.COMPLETED, run.status_reason
    requests = list(ApprovalRequest.objects.filter(run=run).order_by("id"))
    assert [r.status for r in requests] == ["expired", "expired"]
    assert sent_subjects() == []
    assert "expired" in Artifact.objects.get(run=run).content["outcome"]
    assert set(ToolOperation.objects.filter(run=run).values_list("status", flat=True)) == {"rejected"}

    # one reminder per request, however many sweeps ran
    def reminders():
        return [m for m in mail.outbox if m.subject.startswith("[Warden] Reminder")]

    wait_for(lambda: len(reminders()) >= 2, message="the reminders")
    sweep_once()
    reminders = reminders()
    assert len(reminders) == 2 and all(m.to == ["ada@x.example", "rita@x.example"] for m in reminders)


def test_a_policy_can_fail_the_task_on_rejection(demo_tx, worker, reviewer):
    ApprovalPolicy.objects.create(name="strict", tool="email.send", on_reject=ApprovalPolicy.OnReject.FAIL_TASK)
    run = run_start(workflow=two_mails().slug)
    wait_for(lambda: ApprovalRequest.objects.filter(run=run).exists(), message="a request")
    decide(request_id=ApprovalRequest.objects.get(run=run).id, user=reviewer, approve=False, note="no refunds")
    run = completed(run)
    assert run.status == Run.Status.NEEDS_ATTENTION
    task = Task.objects.get(run=run)
    assert task.failure_class == "policy" and "rejected by reviewer: no refunds" in task.status_reason
    assert sent_subjects() == []


def test_expiry_escalates_once_to_the_admins_then_rejects(demo_tx, worker, reviewer):
    ApprovalPolicy.objects.create(
        name="escalate", tool="email.send", expires_after_seconds=1, on_expiry=ApprovalPolicy.OnExpiry.ESCALATE
    )
    script = [{"tool": "email.send", "arguments": REFUND}, {"final": {"outcome": "{last}"}}]
    run = run_start(workflow=scripted_workflow("one-mail", script, tools=["email.send"]).slug)
    wait_for(
        lambda: ApprovalRequest.objects.filter(run=run, escalated_at__isnull=False).exists(), message="the escalation"
    )

    def escalations():
        return [m for m in mail.outbox if m.subject.startswith("[Warden] Escalated")]

    wait_for(lambda: escalations(), message="the escalation e-mail")  # sent just after the sweeper's commit
    escalations = escalations()
    assert len(escalations) == 1 and escalations[0].to == ["ada@x.example"]  # the admins only
    run = completed(run)
    assert ApprovalRequest.objects.get(run=run).status == "expired" and sent_subjects() == []


class Receiver(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((dict(self.headers), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_each_request_is_announced_once_by_email_and_by_a_signed_webhook(demo_tx, worker, reviewer, settings):
    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), Receiver)
    Receiver.received = []
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    settings.WARDEN = {
        **settings.WARDEN,
        "APPROVAL_WEBHOOK_URL": f"http://127.0.0.1:{port}/hook",
        "APPROVAL_WEBHOOK_SECRET": "s3cret",
        "APPROVAL_WEBHOOK_SLACK": True,
    }
    try:
        ApprovalPolicy.objects.create(name="all mail", tool="email.send")
        run = run_start(workflow=two_mails().slug)
        wait_for(lambda: ApprovalRequest.objects.filter(run=run).count() == 1, message="the first request")
        first = ApprovalRequest.objects.get(run=run)
        decide(request_id=first.id, user=reviewer, approve=True)
        wait_for(lambda: ApprovalRequest.objects.filter(run=run).count() == 2, message="the second request")
        decide(request_id=ApprovalRequest.objects.exclude(id=first.id).get(run=run).id, user=reviewer, approve=True)
        completed(run)
        wait_for(lambda: len(Receiver.received) >= 2, message="the webhooks")
        wait_for(lambda: len([m for m in mail.outbox if "Approval needed" in m.subject]) >= 2, message="the e-mails")
        sweep_once()
        sweep_once()
    finally:
        server.shutdown()
    assert Notification.objects.filter(sent_at__isnull=True).count() == 0
    events = []
    for headers, body in Receiver.received:
        assert headers["X-Warden-Signature"] == "sha256=" + signature("s3cret", headers["X-Warden-Timestamp"], body)
        assert Webhook(b"s3cret").verify(body, headers)["event"].startswith("approval.")  # Standard Webhooks
        payload = json.loads(body)
        events.append((payload["event"], payload["request"]["id"]))
        assert payload["request"]["link"].endswith(f"/approvals/#request-{payload['request']['id']}")
        assert payload["text"].startswith("[Warden] Approval needed")
    requests = sorted(ApprovalRequest.objects.filter(run=run).values_list("id", flat=True))
    assert sorted(events) == [("approval.new", r) for r in requests]  # once each
    new_mails = [m for m in mail.outbox if m.subject.startswith("[Warden] Approval needed")]
    assert len(new_mails) == 2


def test_allow_rules_cover_matching_calls_are_revocable_and_irreversible_tools_need_an_admin(
    demo_tx, worker, reviewer, client
):
    from tenancy.models import AuditEvent
    from tenancy.tokens import api_token_create

    ApprovalPolicy.objects.create(name="all mail", tool="email.send")
    rita_token = api_token_create(user=reviewer, scopes=["read", "approve"])[1]
    ada = reviewer.__class__.objects.get(username="ada")
    ada_token = api_token_create(user=ada, scopes=["read", "approve"])[1]

    def post(token, path, body=None):
        return client.post(
            f"/api/v1{path}", data=body or {}, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
        )

    rule = {"project": "default", "tool": "email.send", "arguments": {"subject": "Newsletter"}}
    refused = post(rita_token, "/allow-rules", rule)
    assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "covers_irreversible"
    assert post(rita_token, "/allow-rules", {**rule, "covers_irreversible": True}).status_code == 403
    created = post(ada_token, "/allow-rules", {**rule, "covers_irreversible": True})
    assert created.status_code == 201, created.json()

    run = run_start(workflow=two_mails().slug)
    wait_for(lambda: ApprovalRequest.objects.filter(run=run).exists(), message="the refund's request")
    request = ApprovalRequest.objects.get(run=run)
    assert "Refund issued" in request.summary  # the rule covers the newsletter only
    decide(request_id=request.id, user=reviewer, approve=True)
    run = completed(run)
    assert run.status == Run.Status.COMPLETED and sent_subjects() == ["Newsletter", "Refund issued"]
    newsletter = ToolOperation.objects.get(run=run, arguments__subject="Newsletter")
    assert newsletter.approval_id is None and "allow rule" in newsletter.status_reason

    assert post(rita_token, f"/allow-rules/{created.json()['id']}/revoke").json()["revoked_at"] is not None
    again = run_start(workflow="mailer")
    wait_for(lambda: ApprovalRequest.objects.filter(run=again).exists(), message="a request after the revoke")
    decide(request_id=ApprovalRequest.objects.get(run=again).id, user=reviewer, approve=True)
    # revoked: the newsletter waits for a reviewer again
    wait_for(lambda: ApprovalRequest.objects.filter(run=again).count() == 2, message="the newsletter's request")
    assert "Newsletter" in ApprovalRequest.objects.filter(run=again).order_by("id").last().summary
    events = AuditEvent.objects.filter(action__startswith="allow_rule").order_by("id")
    actions = list(events.values_list("action", "outcome"))
    assert actions == [
        ("allow_rule_add", "denied"),
        ("allow_rule_add", "done"),
        ("allow_rule_use", "done"),  # each use, with the rule's id
        ("allow_rule_revoke", "done"),
    ]
    used = events.get(action="allow_rule_use")
    assert used.detail["rule"] == created.json()["id"] and used.target == f"operation {newsletter.id}"


def test_a_policy_can_reserve_the_decision_for_admins(demo_tx, worker, reviewer):
    from core.errors import Forbidden

    ApprovalPolicy.objects.create(name="big refunds", tool="email.send", decided_by_role="admin")
    script = [{"tool": "email.send", "arguments": REFUND}, {"final": {"outcome": "{last}"}}]
    run = run_start(workflow=scripted_workflow("one-mail", script, tools=["email.send"]).slug)
    wait_for(lambda: ApprovalRequest.objects.filter(run=run).exists(), message="the request")
    request = ApprovalRequest.objects.get(run=run)
    with pytest.raises(Forbidden, match="only a project admin"):
        decide(request_id=request.id, user=reviewer, approve=True)
    assert ApprovalRequest.objects.get(id=request.id).status == "pending"
    decide(request_id=request.id, user=reviewer.__class__.objects.get(username="ada"), approve=True)
    assert completed(run).status == Run.Status.COMPLETED and sent_subjects() == ["Refund issued"]


def test_with_several_matching_policies_the_strictest_applies_on_each_point(demo_tx, worker, reviewer):
    from core.errors import Forbidden

    # One rule sets the shortest expiry; others, without one, reserve the decision for admins and fail
    # the task on rejection. Neither may be lost to the rule that set the expiry.
    ApprovalPolicy.objects.create(name="answer within the hour", tool="email.send", expires_after_seconds=3600)
    ApprovalPolicy.objects.create(name="admins decide", tool="email.send", decided_by_role="admin")
    ApprovalPolicy.objects.create(name="no silent skips", tool="email.send", on_reject="fail_task")
    script = [{"tool": "email.send", "arguments": REFUND}, {"final": {"outcome": "{last}"}}]
    run = run_start(workflow=scripted_workflow("strict-mail", script, tools=["email.send"]).slug)
    wait_for(lambda: ApprovalRequest.objects.filter(run=run).exists(), message="the request")
    request = ApprovalRequest.objects.get(run=run)
    assert request.policy.name == "answer within the hour" and request.expires_at is not None
    with pytest.raises(Forbidden, match="only a project admin"):
        decide(request_id=request.id, user=reviewer, approve=True)
    assert AuditEvent.objects.filter(actor=reviewer, action="decide", outcome="denied", run=run).count() == 1
    admin = reviewer.__class__.objects.get(username="ada")
    decide(request_id=request.id, user=admin, approve=False, note="not this one")
    run = completed(run)
    assert run.status == Run.Status.NEEDS_ATTENTION and "policy" in run.status_reason
    assert sent_subjects() == []


def test_an_expired_request_of_a_policy_that_fails_the_task_fails_it(demo_tx, worker, reviewer):
    ApprovalPolicy.objects.create(
        name="quick and strict", tool="email.send", expires_after_seconds=1, on_reject="fail_task"
    )
    run = completed(run_start(workflow=two_mails().slug))
    assert run.status == Run.Status.NEEDS_ATTENTION
    assert ApprovalRequest.objects.get(run=run).status == "expired"
    task = Task.objects.get(run=run)
    assert task.failure_class == "policy" and "expired" in task.status_reason
    assert sent_subjects() == []
