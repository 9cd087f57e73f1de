"""Agents that run elsewhere: they report to Warden and send each side effect through its ledger.
The shipped example runs against a live server: its refund waits, is approved through the API, is
made once; the example run again with the same ticket changes nothing."""

import json
import os
import subprocess
import sys

import httpx
import pytest

from policy.models import ApprovalPolicy, ApprovalRequest, Decision
from runs.models import Run, Span, Task
from tenancy.access import default_project, membership_grant
from tenancy.tokens import api_token_create
from tests.conftest import ROOT, wait_for
from tools.models import ToolOperation

sys.path.insert(0, str(ROOT / "clients" / "python"))
from warden_client import WardenClient  # noqa: E402

from tools.installation import run_key_prefix


class DjangoTransport(httpx.BaseTransport):
    """The shipped client, talking to Django's test client (inside the test's transaction)."""

    def __init__(self, client):
        self.client = client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.client.generic(
            request.method,
            request.url.raw_path.decode(),
            data=request.content,
            content_type=request.headers.get("content-type", ""),
            HTTP_AUTHORIZATION=request.headers["authorization"],
        )
        return httpx.Response(response.status_code, content=response.content, headers=dict(response.headers))


def client_page(user, run_id: int) -> str:
    from django.test import Client

    browser = Client()
    browser.force_login(user)
    return browser.get(f"/runs/{run_id}/").content.decode()


def bearer(token: str, **extra) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}", **extra}


def call(client, token, path, body=None, **headers):
    if body is None:
        return client.get(path, **bearer(token, **headers))
    return client.post(path, data=json.dumps(body), content_type="application/json", **bearer(token, **headers))


@pytest.fixture
def people(demo, django_user_model, operator):
    reviewer = django_user_model.objects.create_user(username="rita", password="x")
    membership_grant(user=reviewer, project=default_project(), role="reviewer")
    agent_token = api_token_create(user=operator, scopes=["read", "run"], for_agent=True)[1]
    reviewer_token = api_token_create(user=reviewer, scopes=["read", "approve"])[1]
    return agent_token, reviewer_token


def test_an_external_run_reports_waits_for_approval_and_records_the_receipt(people, client):
    agent, reviewer = people
    run = call(client, agent, "/api/v1/runs", {"workflow": "external-agent"}).json()
    assert run["kind"] == "external" and run["status"] == "running" and run["tasks"] == []
    assert (
        call(client, agent, f"/api/v1/runs/{run['id']}/tasks", {"key": "refund", "agent": "billing"}).status_code == 201
    )
    span = {"task": "refund", "name": "gpt-x", "started_at": "2026-01-01T00:00:00Z", "tokens_in": 10, "tokens_out": 5,
            "cost_usd": 0.001}  # fmt: skip
    assert call(client, agent, f"/api/v1/runs/{run['id']}/spans", span).status_code == 201
    assert Run.objects.get(id=run["id"]).tokens_used == 15 and Task.objects.get(key="refund").cost_micros == 1000

    intent = {"task": "refund", "step": 2, "tool": "payments.refund", "arguments": {"charge": "ch_1"},
              "tool_class": "non_idempotent_write", "reversibility": "irreversible"}  # fmt: skip
    op = call(client, agent, f"/api/v1/runs/{run['id']}/operations", intent).json()
    assert op["status"] == "awaiting_approval" and op["idempotency_key"] == f"{run_key_prefix(run['id'])}refund:2"
    refused = call(client, agent, f"/api/v1/operations/{op['id']}/start", {})
    assert refused.status_code == 409  # not approved: it may not be carried out
    other = call(client, agent, f"/api/v1/runs/{run['id']}/operations", {**intent, "arguments": {"charge": "ch_2"}})
    assert other.status_code == 409  # the same step with other arguments
    # The agent's own token can never decide; the reviewer's can.
    approval = ApprovalRequest.objects.get(id=op["approval_id"])
    decision = {"decision": "approve", "note": "ok", "arguments_hash": approval.arguments_hash}
    assert call(client, agent, f"/api/v1/approvals/{approval.id}/decision", decision).status_code == 403
    assert call(client, reviewer, f"/api/v1/approvals/{approval.id}/decision", decision).status_code == 200
    assert call(client, agent, f"/api/v1/operations/{op['id']}?wait=1").json()["status"] == "approved"

    assert call(client, agent, f"/api/v1/operations/{op['id']}/start", {}).json()["status"] == "executing"
    done = call(client, agent, f"/api/v1/operations/{op['id']}/outcome", {"committed": True, "result": {"re": 1},
                                                                          "external_id": "re_1"}).json()  # fmt: skip
    assert done["status"] == "committed" and done["external_id"] == "re_1"
    finished = call(client, agent, f"/api/v1/runs/{run['id']}/finish", {"completed": True}).json()
    assert finished["status"] == "completed"
    assert call(client, agent, f"/api/v1/runs/{run['id']}/spans", span).status_code == 409  # a finished run
    # The dashboard's ledger and trace show it like any other run.
    assert ToolOperation.objects.get(id=op["id"]).status == "committed"
    assert Span.objects.filter(run_id=run["id"], kind="model_call").count() == 1


def test_a_rejected_refund_is_never_started(people, client):
    agent, reviewer = people
    run = call(client, agent, "/api/v1/runs", {"workflow": "external-agent"}).json()
    call(client, agent, f"/api/v1/runs/{run['id']}/tasks", {"key": "refund", "agent": "billing"})
    intent = {"task": "refund", "step": 1, "tool": "payments.refund", "arguments": {"charge": "ch_9"},
              "tool_class": "non_idempotent_write", "reversibility": "irreversible"}  # fmt: skip
    op = call(client, agent, f"/api/v1/runs/{run['id']}/operations", intent).json()
    approval = ApprovalRequest.objects.get(id=op["approval_id"])
    call(client, reviewer, f"/api/v1/approvals/{approval.id}/decision",
         {"decision": "reject", "note": "not this one", "arguments_hash": approval.arguments_hash})  # fmt: skip
    seen = call(client, agent, f"/api/v1/operations/{op['id']}?wait=1").json()
    assert seen["status"] == "rejected" and "not this one" in seen["status_reason"]
    assert call(client, agent, f"/api/v1/operations/{op['id']}/start", {}).status_code == 409


def test_the_example_waits_is_approved_through_the_api_runs_once_and_reruns_to_nothing_new(people, live_url, tmp_path):
    agent, reviewer = people
    env = dict(os.environ, WARDEN_URL=live_url, WARDEN_TOKEN=agent, PROVIDER_LOG=str(tmp_path / "refunds.jsonl"),
               WAIT_SECONDS="60")  # fmt: skip
    example = [sys.executable, str(ROOT / "examples" / "external_agent.py"), "T-4711"]
    first = subprocess.Popen(example, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        request = wait_for(
            lambda: ApprovalRequest.objects.filter(status="pending").first(), timeout=30, message="the refund's request"
        )
        import httpx

        decided = httpx.post(
            f"{live_url}/api/v1/approvals/{request.id}/decision",
            json={
                "decision": "approve",
                "note": "duplicate charge confirmed",
                "arguments_hash": request.arguments_hash,
            },
            headers={"Authorization": f"Bearer {reviewer}"},
        )
        assert decided.status_code == 200, decided.text
        output, _ = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, output
    assert "waiting for a reviewer" in output and "refunded: re_1" in output
    refunds = (tmp_path / "refunds.jsonl").read_text().splitlines()
    assert len(refunds) == 1 and json.loads(refunds[0])["idempotency_key"].startswith("warden:")

    counts = (Run.objects.count(), Span.objects.count(), ToolOperation.objects.count(), Decision.objects.count())
    again = subprocess.run(example, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already refunded earlier: re_1" in again.stdout
    assert len((tmp_path / "refunds.jsonl").read_text().splitlines()) == 1  # the provider was not called again
    assert (
        Run.objects.count(),
        Span.objects.count(),
        ToolOperation.objects.count(),
        Decision.objects.count(),
    ) == counts
    assert Run.objects.get().status == "completed"


def test_an_operator_compensates_an_external_run_and_the_agent_carries_out_the_undo(
    people, client, operator, django_capture_on_commit_callbacks
):
    agent, reviewer = people
    operator_token = api_token_create(user=operator, scopes=["read", "operate"])[1]
    # crm.note is no tool of Warden's registry: a project admin says what it does, or it waits for a reviewer.
    admin_token = api_token_create(user=operator, scopes=["admin"])[1]
    note_class = {"project": "default", "tool": "crm.note", "tool_class": "non_idempotent_write",
                  "reversibility": "irreversible"}  # fmt: skip
    assert call(client, admin_token, "/api/v1/tool-classes", note_class).status_code == 200
    # An irreversible write waits for a reviewer by default: this project lets its notes go unattended.
    ApprovalPolicy.objects.create(name="notes", effect="waive", project=default_project(), tool="crm.note")
    run = call(client, agent, "/api/v1/runs", {"workflow": "external-agent"}).json()
    call(client, agent, f"/api/v1/runs/{run['id']}/tasks", {"key": "support", "agent": "support-agent"})

    def done(step, tool, reversibility, undo=None):
        intent = {"task": "support", "step": step, "tool": tool, "arguments": {"n": step},
                  "tool_class": "non_idempotent_write", "reversibility": reversibility}  # fmt: skip
        op = call(client, agent, f"/api/v1/runs/{run['id']}/operations", {**intent, **({"undo": undo} if undo else {})})
        assert op.status_code < 300, op.content
        outcome = {"committed": True, "external_id": f"x-{step}"}
        return call(client, agent, f"/api/v1/operations/{op.json()['id']}/outcome", outcome).json()

    ticket = done(1, "tickets.create", "reversible", {"tool": "tickets.close", "arguments": {"ticket": "x-1"}})
    email = done(2, "email.send", "irreversible", {"tool": "email.send", "arguments": {"subject": "Correction"}})
    note = done(3, "crm.note", "")  # the agent gave no undo
    call(client, agent, f"/api/v1/runs/{run['id']}/finish", {"completed": False, "reason": "the customer objected"})

    page = client_page(operator, run["id"])
    assert "undo with tickets.close, by the agent" in page and "correction with email.send, by the agent" in page
    plan = call(client, operator_token, f"/api/v1/runs/{run['id']}/compensation").json()
    assert [(i["operation"], i["action"]) for i in plan["undo"]] == [(ticket["id"], "tickets.close")]
    assert [(i["operation"], i["action"]) for i in plan["correct"]] == [(email["id"], "email.send")]
    assert [i["operation"] for i in plan["cannot_undo"]] == [note["id"]]
    compensating = call(client, operator_token, f"/api/v1/runs/{run['id']}/compensate", {"reason": "objection"})
    assert compensating.json()["status"] == "compensating"

    # The agent (its client) lists what it is to carry out: the undo now; the correction once approved.
    sdk = WardenClient("http://testserver", agent, transport=DjangoTransport(client))
    [undo] = sdk.undo_pending(run["id"])
    assert (undo.raw["compensates"], undo.raw["tool"], undo.raw["arguments"]) == (ticket["id"], "tickets.close",
                                                                                   {"ticket": "x-1"})  # fmt: skip
    assert undo.idempotency_key == f"{run_key_prefix(run['id'])}undo:{ticket['id']}"
    ledger = call(client, agent, f"/api/v1/runs/{run['id']}/operations").json()
    correction = next(op for op in ledger if op["compensates"] == email["id"])
    assert (correction["kind"], correction["status"]) == ("correction", "awaiting_approval")
    assert call(client, agent, f"/api/v1/operations/{correction['id']}/start", {}).status_code == 409

    with django_capture_on_commit_callbacks(execute=True):
        sdk.operation_start(undo.id)
        sdk.operation_outcome(undo.id, committed=True, external_id="x-1")
    assert ToolOperation.objects.get(id=ticket["id"]).status == "compensated"
    assert sdk.undo_pending(run["id"]) == []
    assert Run.objects.get(id=run["id"]).status == "compensating"  # the correction still waits

    approval = ApprovalRequest.objects.get(id=correction["approval"])
    decision = {"decision": "approve", "note": "send it", "arguments_hash": approval.arguments_hash}
    with django_capture_on_commit_callbacks(execute=True):
        assert call(client, reviewer, f"/api/v1/approvals/{approval.id}/decision", decision).status_code == 200
    assert ToolOperation.objects.get(id=correction["id"]).status == "approved"  # no worker sends the agent's e-mail
    with django_capture_on_commit_callbacks(execute=True):
        assert call(client, agent, f"/api/v1/operations/{correction['id']}/start", {}).json()["status"] == "executing"
        call(client, agent, f"/api/v1/operations/{correction['id']}/outcome", {"committed": True, "external_id": "m-2"})
    assert ToolOperation.objects.get(id=email["id"]).status == "compensated"
    assert ToolOperation.objects.get(id=note["id"]).status == "committed"  # nothing could undo it
    assert Run.objects.get(id=run["id"]).status == "compensated"


def test_an_undo_the_agent_could_not_carry_out_leaves_the_run_to_a_human(people, client, operator):
    agent, _ = people
    operator_token = api_token_create(user=operator, scopes=["read", "operate"])[1]
    run = call(client, agent, "/api/v1/runs", {"workflow": "external-agent"}).json()
    call(client, agent, f"/api/v1/runs/{run['id']}/tasks", {"key": "support", "agent": "support-agent"})
    intent = {"task": "support", "step": 1, "tool": "tickets.create", "arguments": {}, "reversibility": "reversible",
              "tool_class": "non_idempotent_write", "undo": {"tool": "tickets.close", "arguments": {}}}  # fmt: skip
    op = call(client, agent, f"/api/v1/runs/{run['id']}/operations", intent).json()
    call(client, agent, f"/api/v1/operations/{op['id']}/outcome", {"committed": True})
    call(client, agent, f"/api/v1/runs/{run['id']}/finish", {"completed": False})
    call(client, operator_token, f"/api/v1/runs/{run['id']}/compensate", {})
    undo = next(o for o in call(client, agent, f"/api/v1/runs/{run['id']}/operations").json() if o["compensates"])
    call(client, agent, f"/api/v1/operations/{undo['id']}/start", {})
    call(client, agent, f"/api/v1/operations/{undo['id']}/outcome", {"committed": False, "error": "ticket locked"})
    assert ToolOperation.objects.get(id=op["id"]).status == "compensation_failed"
    finished = Run.objects.get(id=run["id"])
    assert finished.status == "needs_attention" and "ticket locked" in finished.status_reason
