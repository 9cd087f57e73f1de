"""The admin answers every principal as the access table says (docs/access.md), page by page.

For every registered ModelAdmin, one row of the default project (or a shared row), and every principal:
anonymous, a staff member of no project, another project's admin, the project's viewer, operator,
reviewer and admin, and a superuser. Every staff member holds every Django permission on every model, so a
model permission that widened a role would show. Checked: the list (and whether the row is in it), the
row's page (and whether it can be saved), the add form, the delete page, and a POST to the row's page that
may not change it. Every admin action, by every principal, in the second test.
"""

import dramatiq
import pytest
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import Group, Permission
from django.forms.models import model_to_dict
from django.urls import reverse
from django.utils import timezone

from agents.models import Agent, ModelPrice, ModelVersion, Workflow
from approvals.models import BreakerNotification, DecisionLink, Notification, Question
from evals.models import Annotation, EvalCase, EvalResult, EvalRun, EvalSuite
from integrations.models import IdempotencyKey, OtlpExportCursor, OtlpTrace, WebhookDelivery, WebhookEndpoint
from policy.models import AllowRule, ApprovalPolicy, ApprovalRequest, Decision
from replay.models import Replay, Shadow
from runs.models import (
    Artifact,
    BlackboardEntry,
    FaultFiring,
    Outbox,
    Payload,
    QuarantinedResult,
    Run,
    Span,
    WorkerProcess,
)
from runs.services import run_start
from tenancy.access import default_project, membership_grant
from tenancy.models import AuditEvent, ChangeRequest, Membership, Project
from tenancy.tokens import api_token_create
from tests.approvals.test_access import ADMIN_ACTIONS, ALLOWED
from tools.installation import run_key_prefix
from tools.models import (
    HttpTool,
    Installation,
    McpServer,
    McpTool,
    SandboxCall,
    SandboxDeployment,
    SandboxDocument,
    SandboxEmail,
    SandboxRecord,
    SandboxRecordChange,
    SandboxTicket,
    SealedArguments,
    ToolClassification,
    ToolOperation,
)

V, OP, DEC, ADM = "view", "operate", "decide", "administer"
SU = "superuser"  # superusers only
MEMBER = "member"  # any member of any project (shared configuration)
STAFF = "staff"  # any staff member
OWN = "own"  # any staff member, on their own rows (the scene's row is someone else's)
NOBODY = None

# model → (view, change, add, delete): who may, for the scene's row (add: in some project).
TABLE = {
    "auth.user": (SU, SU, SU, SU),
    "auth.group": (SU, SU, SU, SU),
    "django_dramatiq.task": (SU, NOBODY, NOBODY, NOBODY),
    "axes.accessattempt": (SU, SU, NOBODY, SU),
    "axes.accesslog": (SU, SU, NOBODY, SU),
    "axes.accessfailurelog": (SU, SU, NOBODY, SU),
    "runs.run": (V, OP, NOBODY, SU),
    "runs.task": (V, NOBODY, NOBODY, SU),
    "runs.span": (V, NOBODY, NOBODY, SU),
    "runs.artifact": (V, NOBODY, NOBODY, SU),
    "runs.quarantinedresult": (V, NOBODY, NOBODY, SU),
    "runs.outbox": (SU, NOBODY, NOBODY, SU),
    "runs.faultfiring": (V, NOBODY, NOBODY, SU),
    "integrations.otlptrace": (V, NOBODY, NOBODY, SU),
    "integrations.otlpexportcursor": (SU, NOBODY, NOBODY, SU),
    "runs.workerprocess": (SU, NOBODY, NOBODY, SU),
    "runs.payload": (SU, NOBODY, NOBODY, SU),
    "integrations.idempotencykey": (SU, NOBODY, NOBODY, SU),
    "integrations.webhookendpoint": (SU, SU, SU, SU),
    "integrations.webhookdelivery": (SU, NOBODY, NOBODY, SU),
    "evals.evalsuite": (V, ADM, ADM, ADM),
    "evals.evalcase": (V, ADM, ADM, ADM),
    "evals.evalrun": (V, NOBODY, NOBODY, SU),
    "evals.evalresult": (V, NOBODY, NOBODY, SU),
    "evals.annotation": (V, NOBODY, NOBODY, SU),
    "replay.replay": (V, NOBODY, NOBODY, SU),
    "replay.shadow": (V, NOBODY, NOBODY, SU),
    "runs.blackboardentry": (V, NOBODY, NOBODY, SU),
    "agents.agent": (MEMBER, SU, SU, SU),
    "agents.modelprice": (MEMBER, SU, SU, SU),
    "agents.modelversion": (MEMBER, SU, SU, SU),
    "agents.workflow": (V, ADM, ADM, ADM),
    "tools.tooloperation": (V, NOBODY, NOBODY, SU),
    "tools.sealedarguments": (V, NOBODY, NOBODY, SU),
    "tools.toolclassification": (V, ADM, ADM, ADM),
    "tools.httptool": (V, ADM, ADM, ADM),
    "tools.mcpserver": (V, ADM, ADM, ADM),
    "tools.mcptool": (V, NOBODY, NOBODY, SU),
    "agents.agentversion": (MEMBER, NOBODY, NOBODY, NOBODY),
    "agents.workflowversion": (MEMBER, NOBODY, NOBODY, NOBODY),
    "tools.sandboxcall": (SU, NOBODY, NOBODY, SU),
    "tools.installation": (SU, NOBODY, NOBODY, NOBODY),
    "tools.sandboxticket": (SU, SU, SU, SU),
    "tools.sandboxrecord": (SU, SU, SU, SU),
    "tools.sandboxrecordchange": (SU, NOBODY, NOBODY, SU),
    "tools.sandboxemail": (SU, NOBODY, NOBODY, SU),
    "tools.sandboxdeployment": (SU, SU, SU, SU),
    "tools.sandboxdocument": (SU, SU, SU, SU),
    "tenancy.apitoken": (OWN, OWN, STAFF, SU),  # the row is another person's token
    "policy.approvalrequest": (V, NOBODY, NOBODY, SU),
    "tenancy.project": (V, ADM, SU, SU),
    "tenancy.membership": (V, ADM, ADM, ADM),
    "tenancy.auditevent": (V, NOBODY, NOBODY, NOBODY),
    "tenancy.changerequest": (ADM, NOBODY, NOBODY, SU),  # decided on the queue and through the API
    "approvals.breakernotification": (V, NOBODY, NOBODY, SU),
    "policy.decision": (V, NOBODY, NOBODY, NOBODY),
    "policy.approvalpolicy": (V, ADM, ADM, ADM),
    "approvals.notification": (V, NOBODY, NOBODY, SU),
    "approvals.decisionlink": (V, NOBODY, NOBODY, SU),
    "policy.allowrule": (V, NOBODY, NOBODY, SU),
    "approvals.question": (V, NOBODY, NOBODY, SU),
}
PRINCIPALS = ["anonymous", "staff", "outsider", "viewer", "operator", "reviewer", "admin", "superuser"]


def may(rule, who: str, *, row: bool) -> bool:
    """What the table says: ``row`` the scene's row of the default project; otherwise anywhere (a list,
    an add form)."""
    if rule is NOBODY or who == "anonymous":
        return False
    if who == "superuser":
        return True
    if rule == SU:
        return False
    if rule == STAFF:
        return True
    if rule == OWN:
        return not row
    if rule == MEMBER:
        return who != "staff"
    if who == "staff":
        return False
    if who == "outsider":  # the admin of another project: never on this row, anywhere else as an admin
        return not row and rule in ALLOWED["admin"]
    return rule in ALLOWED[who]


def test_the_table_covers_every_registered_model_admin():
    assert {m._meta.label_lower for m in admin.site._registry} == set(TABLE)


@pytest.fixture
def people(db, django_user_model):
    home = default_project()
    elsewhere = Project.objects.create(slug="elsewhere", name="Elsewhere")
    every_permission = list(Permission.objects.all())
    people = {}
    for who in PRINCIPALS[1:]:
        user = django_user_model.objects.create_user(
            username=who, password=f"{who}-pass-123", is_staff=True, is_superuser=who == "superuser"
        )
        user.user_permissions.add(*every_permission)
        if who in ALLOWED:
            membership_grant(user=user, project=home, role=who)
        elif who == "outsider":
            membership_grant(user=user, project=elsewhere, role="admin")
        people[who] = user
    return people


@pytest.fixture
def scene(demo, people, django_user_model):
    """One row of every registered model: of the default project where the model is a project's."""
    home = default_project()
    victim = django_user_model.objects.create_user(username="victim", password="victim-pass-123")
    run = run_start(workflow="deploy-review", started_by=people["operator"])
    task = run.tasks.get(key="inventory")
    workflow = Workflow.objects.create(
        slug="home-flow", name="Home flow", project=home, tasks=[{"key": "a", "agent": "inventory-agent"}]
    )
    op = ToolOperation.objects.create(
        gate="allow",
        run=run,
        task=task,
        step=1,
        tool="email.send",
        idempotency_key=f"{run_key_prefix(run.id)}inventory:1",
        arguments_hash="h" * 64,
        tool_class="non_idempotent_write",
        reversibility="irreversible",
        status=ToolOperation.Status.AMBIGUOUS,
    )
    request = ApprovalRequest.objects.create(
        run=run, kind="operation", summary="email.send(…)", arguments_hash="a" * 64
    )
    suite = EvalSuite.objects.create(slug="home-suite", name="Home suite", project=home)
    case = EvalCase.objects.create(suite=suite, name="case", workflow=workflow)
    eval_run = EvalRun.objects.create(suite=suite)
    endpoint = WebhookEndpoint.objects.create(url="http://127.0.0.1:9/hook", secret="s" * 20, project=home)
    record = SandboxRecord.objects.create(customer_id="cust-m", name="M")
    mcp_server = McpServer.objects.create(project=home, name="helpdesk", transport="stdio", command="tickets")
    message = dramatiq.Message(queue_name="default", actor_name="execute_task", args=(), kwargs={}, options={})
    from django_dramatiq.models import Task as DramatiqTask

    attempt = {"username": "victim", "ip_address": "10.0.0.1", "user_agent": "curl", "http_accept": "*/*"}
    rows = {
        "axes.accessattempt": AccessAttempt.objects.create(**attempt, path_info="/login/", failures_since_start=1),
        "axes.accesslog": AccessLog.objects.create(**attempt, path_info="/login/"),
        "axes.accessfailurelog": AccessFailureLog.objects.create(**attempt, path_info="/login/"),
        "auth.user": victim,
        "auth.group": Group.objects.create(name="ops"),
        "django_dramatiq.task": DramatiqTask.tasks.create_or_update_from_message(message),
        "runs.run": run,
        "runs.task": task,
        "runs.span": Span.objects.filter(run=run).first(),
        "runs.artifact": Artifact.objects.create(run=run, task=task, key="inventory", content={}),
        "runs.quarantinedresult": QuarantinedResult.objects.create(
            run=run, task=task, reason="lease_lost", fencing_token=1, plan_version=1
        ),
        "runs.outbox": Outbox.objects.create(actor="execute_task", kwargs={}),
        "runs.faultfiring": FaultFiring.objects.create(run=run, task_key="inventory", point="start", mode="crash"),
        "integrations.otlptrace": OtlpTrace.objects.create(project=home, trace_id="0" * 32, run=run),
        "integrations.otlpexportcursor": OtlpExportCursor.objects.create(since=run.created_at),
        "runs.workerprocess": WorkerProcess.objects.create(
            name="w1:41", host="w1", pid=41, started_at=run.created_at, beat_at=run.created_at
        ),
        "runs.payload": Payload.objects.create(body={"a": 1}, size=7),
        "integrations.idempotencykey": IdempotencyKey.objects.create(
            scope="s" * 64, key="k", fingerprint="f" * 64, locked_at=run.created_at
        ),
        "integrations.webhookendpoint": endpoint,
        "integrations.webhookdelivery": WebhookDelivery.objects.create(
            endpoint=endpoint, event="run.finished", payload={}, next_attempt_at=run.created_at
        ),
        "evals.evalsuite": suite,
        "evals.evalcase": case,
        "evals.evalrun": eval_run,
        "evals.evalresult": EvalResult.objects.create(eval_run=eval_run, case=case, run=run),
        "evals.annotation": Annotation.objects.create(run=run, score=0.5, comment="ok"),
        "replay.replay": Replay.objects.create(project=home, candidate={"agent": "inventory-agent", "version": 1}),
        "replay.shadow": Shadow.objects.create(
            project=home,
            workflow=run.workflow,
            replay=Replay.objects.create(project=home, candidate={"agent": "inventory-agent", "version": 1}),
        ),
        "runs.blackboardentry": BlackboardEntry.objects.create(run=run, key="pods", version=1, kind="number", value=4),
        "agents.agent": Agent.objects.get(slug="inventory-agent"),
        # First on the list's first page, before the rows seeded from the genai-prices package.
        "agents.modelprice": ModelPrice.objects.create(
            provider="anthropic", model="a-model", input_usd_per_mtok="1", output_usd_per_mtok="2"
        ),
        "agents.modelversion": ModelVersion.objects.create(slug="v2", name="v2"),
        "agents.workflow": workflow,
        "tools.tooloperation": op,
        "tools.sealedarguments": SealedArguments.objects.create(task=task, step=1, values={"api_key": "x"}),
        "tools.toolclassification": ToolClassification.objects.create(
            project=home, tool="crm.note", tool_class="read_only"
        ),
        "tools.sandboxcall": SandboxCall.objects.create(system="email", operation="send", tool="email.send"),
        "tools.httptool": HttpTool.objects.create(
            project=home,
            name="crm.lookup",
            url="http://127.0.0.1:9/x",
            arguments_schema={"type": "object"},
            tool_class="read_only",
        ),
        "tools.mcpserver": mcp_server,
        "tools.mcptool": McpTool.objects.create(
            server=mcp_server, name="helpdesk.search", remote_name="search", tool_class="read_only"
        ),
        "agents.agentversion": Agent.objects.get(slug="inventory-agent").versions.first(),
        "agents.workflowversion": workflow.versions.first(),
        "tools.installation": Installation.objects.get_or_create(key="itest")[0],
        "tools.sandboxticket": SandboxTicket.objects.create(ticket_id="T-1", idempotency_key="k1", customer_id="c"),
        "tools.sandboxrecord": record,
        "tools.sandboxrecordchange": SandboxRecordChange.objects.create(
            record=record, idempotency_key="k2", kind="update", version=2
        ),
        "tools.sandboxemail": SandboxEmail.objects.create(message_id="M-1", idempotency_key="k3", to="a@b.c"),
        "tools.sandboxdeployment": SandboxDeployment.objects.create(service="svc", version="v1", region="eu"),
        "tools.sandboxdocument": SandboxDocument.objects.create(title="Runbook", body="…"),
        "tenancy.apitoken": api_token_create(user=victim)[0],
        "policy.approvalrequest": request,
        "tenancy.project": home,
        "tenancy.membership": Membership.objects.get(user=people["viewer"], project=home),
        "tenancy.auditevent": AuditEvent.objects.create(actor_label="x", action="test", project=home),
        "tenancy.changerequest": ChangeRequest.objects.create(
            project=home, subject="tools.toolclassification", action="create", label="x", requested_by=victim
        ),
        "policy.decision": Decision.objects.create(
            request=request, reviewer=people["reviewer"], verdict="approve", arguments_hash="a" * 64
        ),
        "policy.approvalpolicy": ApprovalPolicy.objects.create(name="mail", project=home, tool="email.send"),
        "approvals.notification": Notification.objects.create(request=request, channel="email", kind="new"),
        "approvals.breakernotification": BreakerNotification.objects.create(
            breaker="tool:1/x.y", kind="tool", name="x.y", project=home, opened_at=timezone.now(), channel="email"
        ),
        "approvals.decisionlink": DecisionLink.objects.create(nonce="n" * 32, request=request, arguments_hash="a" * 64),
        "policy.allowrule": AllowRule.objects.create(project=home, tool="tickets.create", created_by=victim),
        "approvals.question": Question.objects.create(run=run, task=task, step=1, text="Ship?"),
    }
    return rows


def _url(name: str, obj=None) -> str:
    app, model = name.split(".")
    if obj is None:
        return reverse(f"admin:{app}_{model}_changelist")
    return reverse(f"admin:{app}_{model}_{'change' if obj != 'add' else 'add'}", args=[] if obj == "add" else [obj.pk])


def _state(obj) -> dict:
    model = type(obj)
    fresh = model._base_manager.filter(pk=obj.pk).first()
    return model_to_dict(fresh) if fresh is not None else {}


# Who may do what in the admin is decided by the same code whichever database holds the rows (every
# admin page is also opened in both halves by tests/security/test_sweeps.py): checked in one half.
@pytest.mark.anymode
@pytest.mark.parametrize("name", sorted(TABLE))
def test_each_admin_page_answers_each_principal_as_the_table_says(scene, people, client, name):
    view, change, add, delete = TABLE[name]
    obj = scene[name]
    app, model = name.split(".")
    change_url = reverse(f"admin:{app}_{model}_change", args=[obj.pk])
    delete_url = reverse(f"admin:{app}_{model}_delete", args=[obj.pk])
    denied = {302, 403}
    for who in PRINCIPALS:
        client.logout()
        if who != "anonymous":
            client.force_login(people[who])
        where = (name, who)
        # the list, and whether the row is in it
        listing = client.get(_url(name))
        if may(view, who, row=False):
            assert listing.status_code == 200, where
            assert (change_url in listing.content.decode()) == may(view, who, row=True), where
        else:
            assert listing.status_code in denied, (where, listing.status_code)
        # the row's page, and whether it can be saved
        page = client.get(change_url)
        if may(view, who, row=True):
            assert page.status_code == 200, (where, page.status_code)
            assert ('name="_save"' in page.content.decode()) == may(change, who, row=True), where
        else:
            assert page.status_code in denied, (where, page.status_code)
        # the add form
        adding = client.get(reverse(f"admin:{app}_{model}_add"))
        assert (adding.status_code == 200) == may(add, who, row=False), (where, adding.status_code)
        # the delete page (a GET: it shows what would go)
        deleting = client.get(delete_url)
        expected = may(delete, who, row=True) and may(view, who, row=True)
        assert (deleting.status_code == 200) == expected, (where, deleting.status_code)
        # a POST to a row the principal may not change changes nothing
        if not may(change, who, row=True):
            before = _state(obj)
            posted = client.post(change_url, {})
            assert posted.status_code in denied, (where, posted.status_code)
            assert _state(obj) == before, where


ACTION_ROWS = {
    "run": "runs.run",
    "task": "runs.task",
    "tooloperation": "tools.tooloperation",
    "approvalrequest": "policy.approvalrequest",
    "allowrule": "policy.allowrule",
    "apitoken": "tenancy.apitoken",
    "webhookdelivery": "integrations.webhookdelivery",
    "workflow": "agents.workflow",
    "artifact": "runs.artifact",
    "blackboardentry": "runs.blackboardentry",
    "mcptool": "tools.mcptool",
    "shadow": "replay.shadow",
}


def _snapshot():
    return (
        list(Run.objects.order_by("id").values_list("id", "status")),
        list(ToolOperation.objects.order_by("id").values_list("id", "status")),
        list(ApprovalRequest.objects.order_by("id").values_list("id", "status")),
        list(AllowRule.objects.order_by("id").values_list("id", "revoked_at")),
        list(Artifact.objects.order_by("id").values_list("id", "verification")),
        list(BlackboardEntry.objects.order_by("id").values_list("id", "verification")),
        list(WebhookDelivery.objects.order_by("id").values_list("id", "status", "attempts")),
        list(apps.get_model("tenancy", "ApiToken").objects.order_by("id").values_list("id", "revoked_at")),
        list(ToolClassification.objects.order_by("id").values_list("tool", "tool_class")),
        list(Shadow.objects.order_by("id").values_list("id", "on")),
    )


# Who may do what in the admin is decided by the same code whichever database holds the rows (every
# admin page is also opened in both halves by tests/security/test_sweeps.py): checked in one half.
@pytest.mark.anymode
@pytest.mark.parametrize("app,model,action", sorted(ADMIN_ACTIONS))
def test_each_admin_action_answers_each_principal_as_the_table_says(scene, people, client, app, model, action):
    """A principal whose role lacks the action (or who cannot see the row) changes nothing; one whose role
    allows it is not refused (the action may still find nothing to do in the row's state)."""
    rule = ADMIN_ACTIONS[(app, model, action)]
    rule = SU if rule is None else rule  # rows of no project: a superuser's (own tokens: see test_access)
    obj = scene[ACTION_ROWS[model]]
    if model == "approvalrequest":  # a request nobody decided yet, of a run its reviewers did not start
        Run.objects.filter(id=obj.run_id).update(started_by=None)
    for who in PRINCIPALS:
        client.logout()
        if who != "anonymous":
            client.force_login(people[who])
        before, audits = _snapshot(), AuditEvent.objects.filter(outcome="denied").count()
        response = client.post(
            reverse(f"admin:{app}_{model}_changelist"), {"action": action, "_selected_action": [obj.pk]}
        )
        if may(rule, who, row=True):
            assert response.status_code in (200, 302), (action, who, response.status_code)
            refused = AuditEvent.objects.filter(actor=people[who], outcome="denied", action__startswith="denied:")
            assert not refused.exists(), (action, who, list(refused.values_list("action", "target")))
        else:
            assert _snapshot() == before, (action, who)
            sees = may(TABLE[ACTION_ROWS[model]][0], who, row=True)
            if who in ALLOWED and sees:  # a member who sees the row but lacks the role: refused and audited
                assert AuditEvent.objects.filter(outcome="denied").count() > audits, (action, who)
