"""Each way around the approval promise that was found from outside (issue 13), tried again as the
attacker did, through the API, the admin and the engine: each must now fail, and change nothing.

The numbered findings first, then what was found by reading. The frozen executor is in
tests/tools/test_executor_fencing.py, the admin's whole access table in test_admin_matrix.py, and the
invariant over random policies, rules, starters and reviewers in tests/tools/test_gate_stateful.py.
"""

import socket

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.urls import reverse

from agents.models import Agent, Workflow
from integrations.models import WebhookDelivery, WebhookEndpoint
from integrations.webhooks import webhook_deliver
from policy.models import AllowRule, ApprovalPolicy, ApprovalRequest
from runs.heartbeat import lease_keeper
from runs.models import Run, Task
from runs.services import run_start
from saga.executor import run_operations
from tenancy.access import default_project
from tenancy.models import ApiToken, AuditEvent, Membership, Project
from tenancy.tokens import api_token_create
from tests.runs.test_engine import scripted_workflow
from tests.runs.test_run_actions import drive
from tests.tools.test_ledger_api import Api, member
from tools.models import SandboxCall, SandboxEmail, SandboxTicket, ToolOperation

OS = ToolOperation.Status
TICKET = {"customer_id": "cust-9", "title": "Refund follow-up"}
MAIL = {"to": "c@customers.example", "subject": "Refund", "body": "Your refund is on its way."}


@pytest.fixture(autouse=True)
def no_heartbeat(monkeypatch):
    monkeypatch.setattr(lease_keeper, "hold", lambda task_id, token: None)  # runs driven in this thread


@pytest.fixture
def team(demo, client):
    """The default project's people, each with a token of every scope they could use."""
    scopes = ["read", "run", "operate", "approve", "admin"]
    return {
        role: member(client, name, role, scopes=scopes)
        for role, name in [
            ("operator", "otto"),
            ("reviewer", "rita"),
            ("admin", "ada"),
            ("viewer", "vic"),
        ]
    } | {"admin2": member(client, "abe", "admin", scopes=scopes)}


def one_call_workflow(slug: str, tool: str, arguments: dict) -> Workflow:
    script = [{"tool": tool, "arguments": arguments}, {"final": {"done": "{last}"}}]
    return scripted_workflow(slug, script, tools=[tool])


def started_by(api: Api, workflow: str, **body) -> Run:
    response = api("post", "/runs", {"workflow": workflow, **body})
    assert response.status_code == 201, response.json()
    return drive(Run.objects.get(id=response.json()["id"]))


# --- 1. A staff member with the token admin's permissions mints a token for a superuser --------------


def test_1_the_admin_makes_api_tokens_for_oneself_only(db, client, django_user_model):
    root = django_user_model.objects.create_superuser(username="root", password="root-pass-123", email="r@x.y")
    tess = django_user_model.objects.create_user(username="tess", password="tess-pass-123", is_staff=True)
    tess.user_permissions.add(*Permission.objects.filter(content_type__model="apitoken"))
    client.force_login(tess)
    response = client.post(
        reverse("admin:tenancy_apitoken_add"), {"user": root.pk, "name": "mine now", "scopes": '["read"]'}
    )
    assert response.status_code in (200, 403)  # the form refuses the choice, or the service refuses
    assert not ApiToken.objects.filter(user=root).exists()
    # for herself it works, and it is audited
    client.post(reverse("admin:tenancy_apitoken_add"), {"user": tess.pk, "name": "own", "scopes": '["read"]'})
    assert ApiToken.objects.filter(user=tess).count() == 1
    assert AuditEvent.objects.filter(actor=tess, action="token_add", outcome="done").exists()


# --- 2. A reviewer's allow rule waived an admins-only, quorum-2 policy ---------------------------------


def test_2_an_allow_rule_cannot_waive_more_than_its_creator_could_approve(team):
    one_call_workflow("ticketer", "tickets.create", TICKET)
    ApprovalPolicy.objects.create(
        name="tickets need two admins", project=default_project(), tool="tickets.create", quorum=2,
        decided_by_role="admin",
    )  # fmt: skip
    rule = team["reviewer"]("post", "/allow-rules", {"project": "default", "tool": "tickets.create"})
    assert rule.status_code == 201, rule.json()
    run = started_by(team["operator"], "ticketer")
    op = ToolOperation.objects.get(run=run, tool="tickets.create")
    assert op.status == OS.AWAITING_APPROVAL and not SandboxTicket.objects.exists()
    assert (op.approval.quorum, op.approval.admins_only) == (2, True)
    assert f"allow rule {rule.json()['id']} not used" in " ".join(op.verdict["reasons"])
    assert not AuditEvent.objects.filter(action="allow_rule_use").exists()


# --- 3. propose_tools turned a quorum-2 admins-only policy into quorum-1 items -----------------------


def test_3_a_bundle_asks_for_the_strictest_policy_of_its_items(team):
    ApprovalPolicy.objects.create(
        name="mail needs two admins", project=default_project(), tool="email.send", quorum=2, decided_by_role="admin"
    )
    run = started_by(team["operator"], "incident-fanout", input={"propose_tools": ["email.send"]})
    assert run.status == Run.Status.WAITING_FOR_APPROVAL, run.status_reason
    bundle = ApprovalRequest.objects.get(run=run, kind=ApprovalRequest.Kind.BUNDLE)
    assert (bundle.quorum, bundle.admins_only) == (2, True)
    decision = {"decision": "approve", "note": "ok", "arguments_hash": bundle.arguments_hash}

    refused = team["reviewer"]("post", f"/approvals/{bundle.id}/decision", decision)
    assert refused.status_code == 403 and "only a project admin" in refused.json()["message"]
    item = bundle.items.first()
    item_decision = {**decision, "arguments_hash": item.arguments_hash}
    assert team["reviewer"]("post", f"/approvals/{item.id}/decision", item_decision).status_code == 403

    assert team["admin"]("post", f"/approvals/{bundle.id}/decision", decision).status_code == 200
    run_operations(run.id)
    assert not SandboxEmail.objects.exists()  # one admin of the two it needs
    assert team["admin2"]("post", f"/approvals/{bundle.id}/decision", decision).status_code == 200
    run_operations(run.id)
    assert SandboxEmail.objects.count() == 5
    assert Run.objects.get(id=run.id).status == Run.Status.COMPLETED


# --- 4. A project admin's own allow rule let his own run's e-mails out without another person ---------


def test_4_an_allow_rule_never_applies_to_a_run_its_creator_started(team):
    one_call_workflow("mailer", "email.send", MAIL)
    ApprovalPolicy.objects.create(name="mail", project=default_project(), tool="email.send")
    admin = team["admin"]
    created = admin("post", "/allow-rules", {"project": "default", "tool": "email.send", "covers_irreversible": True})
    assert created.status_code == 201
    run = started_by(admin, "mailer")
    op = ToolOperation.objects.get(run=run, tool="email.send")
    assert op.status == OS.AWAITING_APPROVAL and not SandboxEmail.objects.exists()
    assert "its creator started this run" in " ".join(op.verdict["reasons"])
    # nor can he make one for his own run
    scoped = {"project": "default", "tool": "email.send", "covers_irreversible": True, "run": run.id}
    refused = admin("post", "/allow-rules", scoped)
    assert refused.status_code == 403 and "separation of duties" in refused.json()["message"]
    assert AllowRule.objects.count() == 1
    # and he cannot approve it himself; another admin can
    decision = {"decision": "approve", "note": "ok", "arguments_hash": op.approval.arguments_hash}
    assert admin("post", f"/approvals/{op.approval_id}/decision", decision).status_code == 403
    assert team["admin2"]("post", f"/approvals/{op.approval_id}/decision", decision).status_code == 200
    drive(run)
    assert SandboxEmail.objects.count() == 1


# --- 5. Admin forms filtered rows by the view role only -------------------------------------------------


def _staff_with_every_permission(user):
    user.is_staff = True
    user.save()
    user.user_permissions.add(*Permission.objects.all())
    return user


def test_5a_a_viewer_with_the_change_permission_cannot_edit_a_tasks_tools(team, client):
    run = run_start(workflow="deploy-review")
    task = run.tasks.get(key="verify")
    client.force_login(_staff_with_every_permission(team["viewer"].user))
    url = reverse("admin:runs_task_change", args=[task.id])
    response = client.post(url, {"allowed_tools": '["email.send"]', "key": "verify", "objective": "x"})
    assert response.status_code == 403
    assert Task.objects.get(id=task.id).allowed_tools == []


def test_5b_a_project_admin_cannot_make_himself_admin_of_another_project(team, client):
    other = Project.objects.create(slug="payments", name="Payments")
    ada = _staff_with_every_permission(team["admin"].user)
    client.force_login(ada)
    response = client.post(
        reverse("admin:tenancy_membership_add"), {"project": other.pk, "user": ada.pk, "role": "admin"}
    )
    assert response.status_code in (200, 403)  # the form refuses the project, or the save is refused
    assert not Membership.objects.filter(project=other).exists()
    # a reviewer may not grant at all, not even herself more
    rita = _staff_with_every_permission(team["reviewer"].user)
    client.force_login(rita)
    response = client.post(
        reverse("admin:tenancy_membership_add"), {"project": default_project().pk, "user": rita.pk, "role": "admin"}
    )
    assert response.status_code == 403
    assert Membership.objects.get(user=rita, project=default_project()).role == "reviewer"


# --- 6. The sandbox effects listing showed every project's effects --------------------------------------


def test_6_the_effects_listing_shows_only_the_callers_projects(team, client):
    one_call_workflow("ticketer", "tickets.create", TICKET)
    started_by(team["operator"], "ticketer")
    assert SandboxCall.objects.filter(is_effect=True).count() == 1
    stranger = member(client, "sly", "admin", project=Project.objects.create(slug="other", name="Other"))
    assert stranger("get", "/sandbox/effects").json() == {"effects": [], "next_after": None}
    assert len(team["viewer"]("get", "/sandbox/effects").json()["effects"]) == 1


# --- 7. An external agent declared its refund read-only ---------------------------------------------------


def test_7_an_external_agents_claim_cannot_lower_the_verdict(team):
    agent = team["operator"]
    run = agent("post", "/runs", {"workflow": "external-agent"}).json()
    agent("post", f"/runs/{run['id']}/tasks", {"key": "refund", "agent": "billing"})
    intent = {"task": "refund", "step": 1, "tool": "payments.refund", "arguments": {"charge": "ch_1"},
              "tool_class": "read_only"}  # fmt: skip
    op = agent("post", f"/runs/{run['id']}/operations", intent).json()
    assert op["status"] == "awaiting_approval"  # the workflow's policy asks for a reviewer
    assert agent("post", f"/operations/{op['id']}/start", {}).status_code == 409
    stored = ToolOperation.objects.get(id=op["id"])
    assert (stored.tool_class, stored.reversibility) == ("non_idempotent_write", "irreversible")  # not its claim
    # a tool nobody classified waits for a reviewer even with no policy at all
    intent = {**intent, "step": 2, "tool": "crm.note", "arguments": {}}
    assert agent("post", f"/runs/{run['id']}/operations", intent).json()["status"] == "awaiting_approval"


# --- 8. run.finished never reached a project's webhook endpoint from a worker ------------------------------


def test_8_run_finished_reaches_the_projects_endpoint_when_a_worker_completes_it(demo_tx, worker, webhook_receiver):
    from tests.conftest import wait_for

    WebhookEndpoint.objects.create(
        url=webhook_receiver.url, secret="s" * 20, project=default_project(), events=["run.finished"]
    )
    run = run_start(workflow="deploy-review")
    wait_for(lambda: "run.finished" in webhook_receiver.events(), timeout=30, message="run.finished")
    assert Run.objects.get(id=run.id).status == Run.Status.COMPLETED


@pytest.mark.services
@pytest.mark.processes
def test_8_with_real_worker_processes_the_projects_endpoints_receive_every_run_event(
    demo_tx, processes, webhook_receiver
):
    from tests.conftest import wait_for

    WebhookEndpoint.objects.create(url=webhook_receiver.url, secret="s" * 20, project=default_project())
    done = run_start(workflow="deploy-review")
    stopped = run_start(
        workflow="incident-fanout", input={"faults": [{"task": "worker-2", "call": 2, "mode": "error"}]}
    )
    processes.worker(threads=2)
    wanted = {"run.finished", "run.needs_attention"}
    wait_for(lambda: wanted <= set(webhook_receiver.events()), timeout=60, message="both run events")
    assert Run.objects.get(id=done.id).status == Run.Status.COMPLETED
    assert Run.objects.get(id=stopped.id).status == Run.Status.NEEDS_ATTENTION
    assert WebhookDelivery.objects.filter(status="delivered").count() >= 2


# --- Found by reading ----------------------------------------------------------------------------------


def test_a_planner_may_assign_only_its_workflows_agents(demo):
    Agent.objects.create(slug="payments-agent", name="Payments", allowed_tools=["email.send"], script=[])
    planner = Agent.objects.create(
        slug="greedy-planner",
        name="p",
        is_planner=True,
        max_attempts=1,
        script=[{"final": {"tasks": [{"key": "pay", "agent": "payments-agent", "objective": "pay everyone"}]}}],
    )
    Workflow.objects.create(slug="greedy", name="g", planner="agent", planner_agent=planner, agents=["incident-worker"])
    run = drive(run_start(workflow="greedy"))
    assert run.status == Run.Status.NEEDS_ATTENTION
    assert "agent 'payments-agent' is not one of this workflow's agents" in run.status_reason
    assert not run.tasks.filter(agent__slug="payments-agent").exists()


def test_start_and_outcome_are_refused_for_runs_warden_runs_itself(team):
    one_call_workflow("mailer", "email.send", MAIL)
    ApprovalPolicy.objects.create(name="mail", project=default_project(), tool="email.send")
    run = started_by(team["operator"], "mailer")
    op = ToolOperation.objects.get(run=run)
    decision = {"decision": "approve", "note": "ok", "arguments_hash": op.approval.arguments_hash}
    assert team["reviewer"]("post", f"/approvals/{op.approval_id}/decision", decision).status_code == 200
    assert ToolOperation.objects.get(id=op.id).status == OS.APPROVED
    started = team["operator"]("post", f"/operations/{op.id}/start", {})
    assert started.status_code == 409 and "Warden's own workers" in started.json()["message"]
    reported = team["operator"]("post", f"/operations/{op.id}/outcome", {"committed": True})
    assert reported.status_code == 409
    assert ToolOperation.objects.get(id=op.id).status == OS.APPROVED and not SandboxEmail.objects.exists()


def test_an_admin_decision_is_bound_to_the_arguments_it_showed(team, client):
    one_call_workflow("mailer", "email.send", MAIL)
    ApprovalPolicy.objects.create(name="mail", project=default_project(), tool="email.send")
    run = started_by(team["operator"], "mailer")
    request = ToolOperation.objects.get(run=run).approval
    rita = _staff_with_every_permission(team["reviewer"].user)
    client.force_login(rita)
    changelist = reverse("admin:policy_approvalrequest_changelist")
    shown = client.post(changelist, {"action": "approve", "_selected_action": [request.id]})
    assert shown.status_code == 200 and request.arguments_hash in shown.content.decode()  # a confirmation first
    assert ApprovalRequest.objects.get(id=request.id).status == "pending"
    stale = {"action": "approve", "_selected_action": [request.id], "confirm": "yes", f"hash-{request.id}": "0" * 64}
    client.post(changelist, stale)
    assert ApprovalRequest.objects.get(id=request.id).status == "pending"  # the arguments it quoted are not these
    client.post(changelist, {**stale, f"hash-{request.id}": request.arguments_hash})
    assert ApprovalRequest.objects.get(id=request.id).status == "approved"


@pytest.fixture
def private_refused(settings):
    settings.WARDEN = {**settings.WARDEN, "WEBHOOK_ALLOW_PRIVATE": False}


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:5432/", "http://169.254.169.254/latest/meta-data", "http://10.1.2.3/hook", "http://localhost/",
     "http://[::1]:8000/", "http://[::ffff:127.0.0.1]/"],
)  # fmt: skip
def test_webhook_urls_to_private_addresses_are_refused_at_registration(
    db, client, django_user_model, url, private_refused
):
    root = django_user_model.objects.create_superuser(username="root", password="root-pass-123", email="r@x.y")
    client.force_login(root)
    form = {"secret": "s" * 20, "events": "[]", "deliveries-TOTAL_FORMS": "0", "deliveries-INITIAL_FORMS": "0"}
    page = client.post(reverse("admin:integrations_webhookendpoint_add"), {**form, "url": url})
    assert page.status_code == 200 and "loopback, private, link-local or metadata" in page.content.decode()
    assert not WebhookEndpoint.objects.exists()
    # the same form with a public address is saved (a name that does not resolve yet is checked at each send)
    client.post(reverse("admin:integrations_webhookendpoint_add"), {**form, "url": "https://hooks.example.com/warden"})
    assert list(WebhookEndpoint.objects.values_list("url", flat=True)) == ["https://hooks.example.com/warden"]


def test_a_name_that_resolves_to_a_private_address_at_send_time_is_refused(
    db, webhook_receiver, monkeypatch, private_refused
):
    """DNS rebinding: the name looked public when it was registered; by the time of the send it resolves to
    this machine. Nothing is posted, and the delivery says why."""
    public = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", 80))]
    port = int(webhook_receiver.url.split(":")[2].split("/")[0])
    loopback = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
    answers = iter([public, loopback])
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: next(answers))
    from integrations.webhooks import webhook_endpoint_save

    endpoint = webhook_endpoint_save(
        endpoint=WebhookEndpoint(url=f"http://hooks.example.com:{port}/hook", secret="s" * 20),
        actor=None,
        created=True,
    )
    delivery = WebhookDelivery.objects.create(
        endpoint=endpoint, event="run.finished", payload={}, next_attempt_at=endpoint.created_at
    )
    assert webhook_deliver(delivery_id=delivery.id) is False
    delivery.refresh_from_db()
    assert delivery.status == "failed" and delivery.last_error.startswith("refused:")
    assert webhook_receiver.received == []


def test_the_approval_notification_webhook_is_refused_on_a_private_address(db, settings, webhook_receiver, demo):
    from approvals.notify import notifications_send

    settings.WARDEN = {**settings.WARDEN, "WEBHOOK_ALLOW_PRIVATE": False, "APPROVAL_WEBHOOK_URL": webhook_receiver.url}
    one_call_workflow("mailer", "email.send", MAIL)
    ApprovalPolicy.objects.create(name="mail", project=default_project(), tool="email.send")
    drive(run_start(workflow="mailer"))
    notifications_send()
    assert webhook_receiver.received == []


def test_the_token_of_an_agent_can_never_classify_tools(team, client):
    user = get_user_model().objects.get(username="ada")
    with pytest.raises(ValueError, match="never has the approve or admin scope"):
        api_token_create(user=user, scopes=["admin"], for_agent=True)
    token, raw = api_token_create(user=user, scopes=["read"], for_agent=True)
    ApiToken.objects.filter(id=token.id).update(scopes=["read", "admin"])  # edited behind the service's back
    agent = Api(client, raw, user)
    body = {"project": "default", "tool": "payments.refund", "tool_class": "read_only"}
    assert agent("post", "/tool-classes", body).status_code == 403
