"""Projects, roles, token scopes, separation of duties and the audit log, checked from outside: through
the API, the admin and the database, as a user (or an intruder) would meet them."""

from contextlib import contextmanager

import pytest
from django.db import connection, transaction
from django.urls import reverse

from approvals.models import Question
from config.api import api as ninja_api
from evals.demo import demo_suite_load
from evals.models import Annotation, EvalCase, EvalRun, EvalSuite
from policy.models import ApprovalRequest
from replay.models import Replay, ReplayRun, Shadow
from runs.models import Artifact, BlackboardEntry, Run
from runs.services import run_start
from tenancy.access import default_project, membership_grant
from tenancy.models import AuditEvent, ChangeRequest, Membership, Project
from tenancy.tokens import api_token_create
from tools.installation import run_key_prefix
from tools.models import McpServer, McpTool, ToolClassification, ToolOperation

# Every API operation, the role action it needs, and the token scope. A new endpoint without a row
# here fails test_every_api_operation_has_a_row_in_the_policy_table.
POLICY = {
    ("POST", "/api/v1/runs"): ("start", "run"),
    ("GET", "/api/v1/runs"): ("view (filtered)", "read"),
    ("GET", "/api/v1/runs/{run_id}"): ("view", "read"),
    ("GET", "/api/v1/runs/{run_id}/tasks"): ("view", "read"),
    ("GET", "/api/v1/runs/{run_id}/trace"): ("view", "read"),
    ("GET", "/api/v1/runs/{run_id}/trace/otlp"): ("view", "read"),
    ("GET", "/api/v1/runs/{run_id}/artifacts"): ("view", "read"),
    ("GET", "/api/v1/audit"): ("view (filtered)", "read"),
    ("GET", "/api/v1/workflows"): ("view (filtered)", "read"),
    ("GET", "/api/v1/agents"): ("any member", "read"),
    ("GET", "/api/v1/insight"): ("view (filtered)", "read"),
    ("GET", "/api/v1/inbox"): ("view (filtered: what waits for the caller)", "read"),
    ("POST", "/api/v1/runs/{run_id}/cancel"): ("operate", "operate"),
    ("POST", "/api/v1/runs/{run_id}/tasks"): ("start", "run"),
    ("POST", "/api/v1/runs/{run_id}/spans"): ("start", "run"),
    ("POST", "/api/v1/runs/{run_id}/operations"): ("start", "run"),
    ("GET", "/api/v1/operations/{operation_id}"): ("view", "read"),
    ("POST", "/api/v1/operations/{operation_id}/start"): ("start", "run"),
    ("POST", "/api/v1/operations/{operation_id}/outcome"): ("start", "run"),
    ("POST", "/api/v1/runs/{run_id}/finish"): ("start", "run"),
    ("POST", "/api/v1/runs/{run_id}/resume"): ("operate", "operate"),
    ("POST", "/api/v1/runs/{run_id}/tasks/{task_key}/retry"): ("operate", "operate"),
    ("GET", "/api/v1/runs/{run_id}/fork-preview"): ("operate", "operate"),
    ("POST", "/api/v1/runs/{run_id}/fork"): ("operate", "operate"),
    ("GET", "/api/v1/runs/{run_id}/operations"): ("view", "read"),
    ("GET", "/api/v1/runs/{run_id}/compensation"): ("view", "read"),
    ("POST", "/api/v1/runs/{run_id}/compensate"): ("operate", "operate"),
    ("POST", "/api/v1/operations/{operation_id}/resolve"): ("operate", "operate"),
    ("GET", "/api/v1/sandbox/effects"): ("any member", "read"),
    ("GET", "/api/v1/approvals"): ("view (filtered)", "read"),
    ("POST", "/api/v1/approvals/{approval_id}/decision"): ("decide", "approve"),
    ("GET", "/api/v1/allow-rules"): ("view (filtered)", "read"),
    ("POST", "/api/v1/allow-rules"): ("decide", "approve"),
    ("POST", "/api/v1/allow-rules/{rule_id}/revoke"): ("decide", "approve"),
    ("GET", "/api/v1/tool-classes"): ("view (filtered)", "read"),
    ("GET", "/api/v1/questions"): ("view (filtered)", "read"),
    ("GET", "/api/v1/questions/{question_id}"): ("view", "read"),
    ("POST", "/api/v1/questions/{question_id}/answer"): ("decide", "approve"),
    ("POST", "/api/v1/tool-classes"): ("administer", "admin"),
    ("GET", "/api/v1/eval-suites"): ("view (filtered)", "read"),
    ("POST", "/api/v1/eval-suites"): ("administer", "admin"),
    ("GET", "/api/v1/eval-suites/{suite_id}"): ("view", "read"),
    ("GET", "/api/v1/eval-suites/{suite_id}/comparison"): ("view", "read"),
    ("POST", "/api/v1/eval-suites/{suite_id}/runs"): ("start", "run"),
    ("POST", "/api/v1/eval-suites/{suite_id}/cases"): ("curate", "operate or approve"),
    ("GET", "/api/v1/eval-runs/{eval_run_id}"): ("view", "read"),
    ("GET", "/api/v1/runs/{run_id}/annotations"): ("view", "read"),
    ("POST", "/api/v1/runs/{run_id}/annotations"): ("decide", "approve"),
    # Worker processes are shared by every project: an operator of any project sees them (tasks only of theirs).
    ("GET", "/api/v1/workers"): ("operate, in any project", "read"),
    # Changes of a project's rules that wait for a second admin (issue 25): its admins' business only.
    ("GET", "/api/v1/change-requests"): ("administer (filtered)", "read"),
    ("GET", "/api/v1/change-requests/{change_id}"): ("administer", "read"),
    ("POST", "/api/v1/change-requests/{change_id}/decision"): ("administer", "admin"),
    ("POST", "/api/v1/change-requests/{change_id}/withdraw"): ("administer", "admin"),
    # Declarations as code (issue 26): exported to members, applied by the project's admins.
    ("GET", "/api/v1/projects/{slug}/declarations"): ("view", "read"),
    ("PUT", "/api/v1/projects/{slug}/declarations"): ("administer", "admin"),
    ("PUT", "/api/v1/projects/{slug}/declarations/{kind}/{name}"): ("administer", "admin"),
    # What-if replays (issue 29): trying a version operates the runs; a draft's edits would need administer.
    ("POST", "/api/v1/replays"): ("operate", "operate"),
    ("GET", "/api/v1/replays/{replay_id}"): ("view", "read"),
    # Shadows of live runs: the same, and switching one off operates it.
    ("POST", "/api/v1/shadows"): ("operate", "operate"),
    ("GET", "/api/v1/shadows/{shadow_id}"): ("view", "read"),
    ("POST", "/api/v1/shadows/{shadow_id}/off"): ("operate", "operate"),
}
BODIES = {
    "/api/v1/runs": {"workflow": "deploy-review"},
    "/api/v1/runs/{run_id}/compensate": {"reason": "x"},
    "/api/v1/runs/{run_id}/cancel": {"reason": "x"},
    "/api/v1/runs/{run_id}/tasks": {"key": "ext", "agent": "outside"},
    "/api/v1/runs/{run_id}/spans": {"task": "risk", "name": "m", "started_at": "2026-11-29T10:00:00Z"},
    "/api/v1/runs/{run_id}/operations": {"task": "risk", "step": 1, "tool": "t.x", "tool_class": "read_only"},
    "/api/v1/operations/{operation_id}/outcome": {"committed": True},
    "/api/v1/runs/{run_id}/finish": {"completed": True},
    "/api/v1/runs/{run_id}/resume": {"reason": "x"},
    "/api/v1/runs/{run_id}/tasks/{task_key}/retry": {"reason": "x"},
    "/api/v1/runs/{run_id}/fork": {"task": "risk", "step": 1},
    "/api/v1/operations/{operation_id}/resolve": {"committed": True},
    "/api/v1/approvals/{approval_id}/decision": {"decision": "approve", "note": "ok", "arguments_hash": "{hash}"},
    "/api/v1/allow-rules": {"project": "default", "tool": "tickets.create", "arguments": {"customer_id": "c1"}},
    "/api/v1/tool-classes": {"project": "default", "tool": "crm.note", "tool_class": "read_only"},
    "/api/v1/questions/{question_id}/answer": {"answer": "yes"},
    "/api/v1/eval-suites/{suite_id}/cases": {
        "name": "x",
        "workflow": "deploy-review",
        "checks": [{"status": "failed"}],
    },
    "/api/v1/runs/{run_id}/annotations": {"score": 0.5},
    "/api/v1/eval-suites": {"slug": "new-suite", "name": "New", "project": "default"},
    "/api/v1/change-requests/{change_id}/decision": {"decision": "approve"},
    "/api/v1/projects/{slug}/declarations": {"classifications": [{"tool": "crm.other", "tool_class": "read_only"}]},
    "/api/v1/projects/{slug}/declarations/{kind}/{name}": {"tool_class": "read_only"},
    "/api/v1/replays": lambda ids: {"runs": [ids["run_id"]], "agent": "inventory-agent", "version": ids["version"]},
    "/api/v1/shadows": lambda ids: {"workflow": "deploy-review", "agent": "inventory-agent", "version": ids["version"]},
}
ALLOWED = {  # role → actions
    "viewer": {"view"},
    "operator": {"view", "start", "operate", "curate"},
    "reviewer": {"view", "decide", "curate"},
    "admin": {"view", "start", "operate", "decide", "curate", "administer"},
}


def _operations():
    for path, methods in ninja_api.get_openapi_schema()["paths"].items():
        for method in methods:
            yield method.upper(), path


def test_every_api_operation_has_a_row_in_the_policy_table():
    assert set(_operations()) == set(POLICY)


@pytest.fixture
def scene(demo, django_user_model):
    """A run of the default project with an ambiguous operation and a pending approval request, people
    with each role, and an outsider who belongs to another project only."""
    home = default_project()
    other = Project.objects.create(slug="elsewhere", name="Elsewhere")
    people = {}
    for role in ALLOWED:
        user = django_user_model.objects.create_user(username=role, password=f"{role}-pass-123")
        membership_grant(user=user, project=home, role=role)
        people[role] = user
    outsider = django_user_model.objects.create_user(username="outsider", password="outsider-pass-123")
    membership_grant(user=outsider, project=other, role="admin")
    people["outsider"] = outsider
    run = run_start(workflow="deploy-review")
    Run.objects.filter(id=run.id).update(status=Run.Status.NEEDS_ATTENTION)
    op = ToolOperation.objects.create(
        gate="allow",
        run=run,
        tool="email.send",
        idempotency_key=f"{run_key_prefix(run.id)}x:1",
        arguments_hash="h",
        tool_class="non_idempotent_write",
        status=ToolOperation.Status.AMBIGUOUS,
    )
    approval = ApprovalRequest.objects.create(
        run=run, kind="operation", summary="email.send(...)", arguments_hash="a" * 64
    )
    from policy.models import AllowRule

    rule = AllowRule.objects.create(project=home, tool="tickets.create", created_by=people["admin"])
    question = Question.objects.create(
        run=run, task=run.tasks.get(key="risk"), step=2, text="Ship?", choices=["yes", "no"]
    )
    suite = demo_suite_load()
    # Another admin of the project asked to lower a classification: the scene's admin may decide it.
    asker = django_user_model.objects.create_user(username="asker", password="asker-pass-123")
    membership_grant(user=asker, project=home, role="admin")
    change = ChangeRequest.objects.create(
        project=home, subject="tools.toolclassification", action="create", label="the classification of crm.note",
        after={"tool": "crm.note", "tool_class": "read_only", "reversibility": "", "approval": "", "note": ""},
        loosens=["x"], requested_by=asker,
    )  # fmt: skip
    server = McpServer.objects.create(project=home, name="helpdesk", transport="http", url="http://127.0.0.1:9/mcp")
    mcp_tool = McpTool.objects.create(server=server, name="helpdesk.search", remote_name="search",
                                      tool_class="read_only", input_schema={"type": "object"})  # fmt: skip
    ids = {
        "suite_id": suite.id,
        "eval_run_id": EvalRun.objects.create(suite=suite).id,
        "run_id": run.id,
        "operation_id": op.id,
        "approval_id": approval.id,
        "hash": approval.arguments_hash,
        "rule_id": rule.id,
        "task_key": "risk",
        "question_id": question.id,
        "change_id": change.id,
        "slug": home.slug,
        "kind": "classifications",
        "name": "crm.other",
        "version": run.versions["agents"]["inventory-agent"]["version"],
        "replay_id": Replay.objects.create(project=home, candidate={"agent": "inventory-agent", "version": 1}).id,
        "shadow_id": Shadow.objects.create(
            project=home,
            workflow=run.workflow,
            replay=Replay.objects.create(project=home, candidate={"agent": "inventory-agent", "version": 1}),
        ).id,
    }
    artifact = Artifact.objects.create(run=run, task=run.tasks.get(key="inventory"), key="inventory", content={})
    entry = BlackboardEntry.objects.create(run=run, key="pods", version=1, kind="number", value=4)
    scene = {"run": run, "people": people, "ids": ids, "approval": approval, "op": op, "rule": rule}
    return {**scene, "artifact": artifact, "entry": entry, "change": change, "mcp_tool": mcp_tool}


QUERIES = {"/api/v1/runs/{run_id}/fork-preview": "?task=risk&step=1"}


def _call(client, token, method, path, ids):
    url = path.format(**ids) + QUERIES.get(path, "")
    body = BODIES.get(path, {})
    body = body(ids) if callable(body) else {k: (v.format(**ids) if isinstance(v, str) else v) for k, v in body.items()}
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    if method in ("POST", "PUT"):
        send = client.post if method == "POST" else client.put
        return send(url, data=body, content_type="application/json", **headers)
    return client.get(url, **headers)


def _state(scene):
    from policy.models import AllowRule

    run, op, approval = scene["run"], scene["op"], scene["approval"]
    run.refresh_from_db()
    op.refresh_from_db()
    approval.refresh_from_db()
    rules = list(AllowRule.objects.values_list("id", "revoked_at"))
    verdicts = list(Artifact.objects.values_list("id", "verification"))
    verdicts += list(BlackboardEntry.objects.values_list("id", "verification"))
    classes = list(ToolClassification.objects.values_list("tool", "tool_class"))
    questions = list(Question.objects.values_list("id", "status", "answer"))
    evals = EvalSuite.objects.count(), EvalCase.objects.count(), EvalRun.objects.count(), Annotation.objects.count()
    changes = list(ChangeRequest.objects.values_list("id", "status"))
    return (
        run.status,
        op.status,
        approval.status,
        Run.objects.count(),
        rules,
        verdicts,
        classes,
        questions,
        evals,
        changes,
    )


WHO = ["anonymous", "viewer", "operator", "reviewer", "admin", "outsider"]
SCOPES = ["read", "run", "operate", "approve", "admin"]


@contextmanager
def undone():
    """Each caller meets the scene as it was built (a refusal must change nothing, an allowed call may
    change anything): the call runs in a savepoint that is rolled back, so that one scene serves every
    caller of an operation instead of a scene built per caller."""
    with transaction.atomic():
        yield
        transaction.set_rollback(True)


# Which role and scope may call what is decided by the same code whichever database answers (every
# operation is also called on PostgreSQL by tests/runs/test_api_schema.py): checked in one half.
@pytest.mark.anymode
@pytest.mark.parametrize("method,path", sorted(POLICY))
def test_the_authorization_matrix(scene, client, method, path):
    """Each role against each operation: allowed, 401, 403 or 404, and a refusal changes nothing."""
    for who in WHO:
        with undone():
            _one_role(scene, client, method, path, who)


def _one_role(scene, client, method, path, who):
    action, scope = POLICY[(method, path)]
    any_project = action.endswith(", in any project")  # the outsider operates their own project
    action = action.split(",")[0]
    token = None
    if who != "anonymous":
        token = api_token_create(user=scene["people"][who], scopes=SCOPES)[1]
    before = _state(scene)
    response = _call(client, token, method, path, scene["ids"])
    # the default project's: starting a run there, or creating an allow rule for it
    project_scoped = "{" in path or (method, path) in {
        ("POST", "/api/v1/runs"),
        ("POST", "/api/v1/allow-rules"),
        ("POST", "/api/v1/tool-classes"),
        ("POST", "/api/v1/eval-suites"),
        ("POST", "/api/v1/replays"),
        ("POST", "/api/v1/shadows"),
    }
    if who == "anonymous":
        expected = 401
    elif who == "outsider" and project_scoped:
        expected = 404  # another project's objects do not exist for them
    elif who == "outsider" and any_project:
        expected = None
    elif action in ("view", "start", "operate", "decide", "curate", "administer") and action not in ALLOWED.get(
        who, set()
    ):
        expected = 403
    else:
        expected = None  # allowed: any 2xx, or a 409/422 about the object's state, never 401/403/404
    if expected is None:
        assert response.status_code not in (401, 403, 404), (who, method, path, response.json())
    else:
        assert response.status_code == expected, (who, method, path, response.json())
        assert set(response.json()) == {"code", "message", "errors"}
        assert _state(scene) == before, who
        if expected in (403, 404):
            assert AuditEvent.objects.filter(actor=scene["people"][who], outcome="denied").exists(), who


# Which role and scope may call what is decided by the same code whichever database answers (every
# operation is also called on PostgreSQL by tests/runs/test_api_schema.py): checked in one half.
@pytest.mark.anymode
@pytest.mark.parametrize("method,path", sorted(POLICY))
def test_each_token_scope_against_each_operation(scene, client, method, path):
    """An admin's token with one scope: it may do exactly what that scope covers, and a refusal changes nothing."""
    needed = POLICY[(method, path)][1].split(" or ")  # any one of them
    for scope in SCOPES:
        with undone():
            token = api_token_create(user=scene["people"]["admin"], scopes=[scope])[1]
            before = _state(scene)
            response = _call(client, token, method, path, scene["ids"])
            if scope in needed:
                assert response.status_code not in (401, 403, 404), (scope, method, path, response.json())
            else:
                named = " or ".join(f"'{one}'" for one in needed)
                assert response.status_code == 403 and f"{named} scope" in response.json()["message"], (
                    scope,
                    response.json(),
                )
                assert _state(scene) == before, scope


def test_a_token_without_the_scope_is_refused_even_for_an_admin(scene, client):
    admin = scene["people"]["admin"]
    token = api_token_create(user=admin)[1]  # default scopes: no approve
    path = "/api/v1/approvals/{approval_id}/decision"
    response = _call(client, token, "POST", path, scene["ids"])
    assert response.status_code == 403 and "approve" in response.json()["message"]
    assert scene["approval"].__class__.objects.get(id=scene["approval"].id).status == "pending"


def test_whoever_started_a_run_cannot_approve_its_actions(scene, client):
    reviewer = scene["people"]["reviewer"]
    Run.objects.filter(id=scene["run"].id).update(started_by=reviewer)
    token = api_token_create(user=reviewer, scopes=["read", "approve"])[1]
    response = _call(client, token, "POST", "/api/v1/approvals/{approval_id}/decision", scene["ids"])
    assert response.status_code == 403 and "separation of duties" in response.json()["message"]
    assert ApprovalRequest.objects.get(id=scene["approval"].id).status == ApprovalRequest.Status.PENDING
    assert AuditEvent.objects.filter(actor=reviewer, action="decide", outcome="denied").exists()


def test_a_reviewer_whose_role_was_removed_is_refused_at_once(scene, client):
    reviewer = scene["people"]["reviewer"]
    token = api_token_create(user=reviewer, scopes=["read", "approve"])[1]
    listed = client.get("/api/v1/approvals", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert [a["id"] for a in listed] == [scene["approval"].id]  # seen while still a reviewer
    Membership.objects.filter(user=reviewer).update(role="viewer")
    response = _call(client, token, "POST", "/api/v1/approvals/{approval_id}/decision", scene["ids"])
    assert response.status_code == 403
    Membership.objects.filter(user=reviewer).delete()
    response = _call(client, token, "POST", "/api/v1/approvals/{approval_id}/decision", scene["ids"])
    assert response.status_code == 404
    assert ApprovalRequest.objects.get(id=scene["approval"].id).status == ApprovalRequest.Status.PENDING


def test_the_admin_shows_a_staff_member_only_their_projects(scene, client, django_user_model):
    outsider = scene["people"]["outsider"]
    outsider.is_staff = True
    outsider.save()
    from django.contrib.auth.models import Permission

    outsider.user_permissions.add(*Permission.objects.filter(codename__in=["view_run", "change_run"]))
    client.force_login(outsider)
    listing = client.get(reverse("admin:runs_run_changelist")).content.decode()
    assert f"run {scene['run'].id} " not in listing
    assert client.get(reverse("admin:runs_run_change", args=[scene["run"].id])).status_code in (302, 404)
    # an admin action on it is refused too, and recorded
    client.post(reverse("admin:runs_run_changelist"), {"action": "cancel_runs", "_selected_action": [scene["run"].id]})
    assert Run.objects.get(id=scene["run"].id).status == Run.Status.NEEDS_ATTENTION


def test_admin_actions_check_the_role_and_are_audited(scene, client):
    viewer = scene["people"]["viewer"]
    viewer.is_staff = True
    viewer.save()
    from django.contrib.auth.models import Permission

    viewer.user_permissions.add(*Permission.objects.filter(codename__in=["view_run", "change_run"]))
    client.force_login(viewer)
    page = client.post(
        reverse("admin:runs_run_changelist"),
        {"action": "cancel_runs", "_selected_action": [scene["run"].id]},
        follow=True,
    ).content.decode()
    assert "may not operate" in page
    assert Run.objects.get(id=scene["run"].id).status == Run.Status.NEEDS_ATTENTION
    assert AuditEvent.objects.filter(actor=viewer, action="denied:operate").exists()
    operator = scene["people"]["operator"]
    operator.is_staff = True
    operator.save()
    operator.user_permissions.add(*Permission.objects.filter(codename__in=["view_run", "change_run"]))
    client.force_login(operator)
    client.post(reverse("admin:runs_run_changelist"), {"action": "cancel_runs", "_selected_action": [scene["run"].id]})
    assert Run.objects.get(id=scene["run"].id).status == Run.Status.CANCELLED
    assert AuditEvent.objects.filter(actor=operator, action="run_cancel", outcome="done", run=scene["run"]).exists()
    page = client.get(reverse("admin:runs_run_change", args=[scene["run"].id])).content.decode()
    assert "run_cancel" in page and "operator" in page  # the run's page shows its audit trail


def test_the_audit_log_cannot_be_changed_or_deleted(scene):
    event = AuditEvent.objects.create(actor_label="x", action="test")
    with pytest.raises(PermissionError):
        AuditEvent.objects.filter(id=event.id).update(action="forged")
    with pytest.raises(PermissionError):
        AuditEvent.objects.filter(id=event.id).delete()
    with pytest.raises(PermissionError):
        event.save()
    with pytest.raises(PermissionError):
        event.delete()
    if connection.vendor == "postgresql":  # below the ORM, the database refuses as well
        from django.db import DatabaseError, transaction

        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("UPDATE approvals_auditevent SET action = 'forged' WHERE id = %s", [event.id])
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("DELETE FROM approvals_auditevent WHERE id = %s", [event.id])
    assert AuditEvent.objects.get(id=event.id).action == "test"


def test_logins_and_failed_logins_are_audited(db, client, django_user_model):
    django_user_model.objects.create_user(username="dana", password="dana-pass-123", is_staff=True)
    client.post(reverse("admin:login"), {"username": "dana", "password": "wrong"})
    client.post(reverse("admin:login"), {"username": "dana", "password": "dana-pass-123"})
    events = list(AuditEvent.objects.filter(action="login").order_by("id").values_list("outcome", "target"))
    assert events == [("denied", "dana"), ("done", "dana")]
    assert "wrong" not in str(list(AuditEvent.objects.values()))  # never the password


def test_a_token_made_by_the_command_has_only_the_scopes_asked_for(db, django_user_model, capsys):
    from django.core.management import call_command

    from tenancy.models import ApiToken

    user = django_user_model.objects.create_user(username="agent-runner", password="agent-pass-123")
    call_command("create_api_token", "agent-runner")
    call_command("create_api_token", "agent-runner", "--scope", "read", "--scope", "approve")
    assert [t.scopes for t in ApiToken.objects.filter(user=user).order_by("id")] == [
        ["operate", "read", "run"],
        ["approve", "read"],
    ]


# For each action, the roles of the project that lack it (each is tried on each admin action below).
ROLES_BELOW = {
    action: tuple(role for role, actions in ALLOWED.items() if action not in actions)
    for action in ("operate", "decide", "start", "view")
}


# Every admin action, and the role action it needs in the row's project (None: any staff user on rows
# they can see — their own tokens). A new admin action without a row fails the first test below.
ADMIN_ACTIONS = {
    ("runs", "run", "cancel_runs"): "operate",
    ("runs", "run", "resume_runs"): "operate",
    ("runs", "run", "compensate_runs"): "operate",
    ("runs", "task", "retry_tasks"): "operate",
    ("runs", "artifact", "reject_artifacts"): "operate",
    ("runs", "blackboardentry", "verify_entries"): "operate",
    ("runs", "blackboardentry", "reject_entries"): "operate",
    ("tools", "tooloperation", "resolve_committed"): "operate",
    ("tools", "tooloperation", "resolve_not_committed"): "operate",
    ("policy", "approvalrequest", "approve"): "decide",
    ("policy", "approvalrequest", "reject"): "decide",
    ("policy", "allowrule", "revoke"): "decide",
    ("tenancy", "apitoken", "revoke"): None,
    ("integrations", "webhookdelivery", "redeliver"): None,  # superusers only (the model admin refuses others)
    ("agents", "workflow", "start_runs"): "start",
    ("tools", "mcptool", "confirm_suggested_class"): "administer",
    ("replay", "shadow", "switch_off"): "operate",
}


def _admin_actions(rf, superuser):
    from django.contrib import admin

    request = rf.get("/admin/")
    request.user = superuser
    for model, model_admin in admin.site._registry.items():
        for name in model_admin.get_actions(request):
            if name != "delete_selected":
                yield (model._meta.app_label, model._meta.model_name, name)


def test_every_admin_action_has_a_row_in_the_policy_table(db, rf, django_user_model):
    root = django_user_model.objects.create_superuser(username="root", password="root-pass-123", email="r@x.y")
    assert set(_admin_actions(rf, root)) == set(ADMIN_ACTIONS)


@pytest.mark.parametrize(
    "app,model,action,who",
    [(*k, who) for k, v in ADMIN_ACTIONS.items() if v for who in ROLES_BELOW.get(v, ("viewer",))],
)
def test_an_admin_action_beyond_the_role_changes_nothing_and_is_audited(scene, client, app, model, action, who):
    """A member whose role lacks the action, with every Django permission on the model, still may not
    act: the role decides."""
    from django.apps import apps
    from django.contrib.auth.models import Permission

    from policy.models import AllowRule

    viewer = scene["people"][who]
    viewer.is_staff = True
    viewer.save()
    viewer.user_permissions.add(*Permission.objects.filter(content_type__app_label=app))
    client.force_login(viewer)
    rows = {
        "run": scene["run"].id,
        "task": scene["run"].tasks.first().id,
        "tooloperation": scene["op"].id,
        "approvalrequest": scene["approval"].id,
        "allowrule": scene["rule"].id,
        "workflow": scene["run"].workflow_id,
        "artifact": scene["artifact"].id,
        "blackboardentry": scene["entry"].id,
        "mcptool": scene["mcp_tool"].id,
        "shadow": scene["ids"]["shadow_id"],
    }

    def state():
        revoked = list(AllowRule.objects.values_list("revoked_at", flat=True))
        return _state(scene), revoked, Run.objects.count(), list(Shadow.objects.values_list("on", flat=True))

    before = state()
    client.post(reverse(f"admin:{app}_{model}_changelist"), {"action": action, "_selected_action": [rows[model]]})
    assert state() == before
    assert AuditEvent.objects.filter(actor=viewer, outcome="denied").exists()
    apps.get_model(app, model)  # the table names real models


# Every page outside the API and the admin: who may open it. A new URL without a row fails the test.
PAGES = {
    "": "public redirect",
    "login/": "public",
    "favicon.ico": "public redirect (to the static icon)",
    "logout/": "public (POST)",
    "approvals/": "member",
    "inbox/": "member (what waits for them in their projects)",
    "inbox/counts": "member",
    "inbox/breakers/<str:what>/<str:name>/close": "superuser (POST): the deployment's breakers, every project's",
    "inbox/breakers/<str:what>/<slug:project>/<str:name>/close": "administer (POST), in the tool's project",
    "approvals/new": "member",
    "approvals/<int:request_id>/decide": "decide (POST)",
    "approvals/changes/<int:change_id>/decide": "administer (POST), not its author",
    "approvals/link/<str:token>": "decide, in the request's project (the link's card; POST decides once)",
    "questions/<int:question_id>/answer": "decide (POST)",
    "runs/": "member (their projects' runs)",
    "runs/bulk": "operate (POST), per run",
    "runs/start": "start (POST), in the workflow's project",
    "runs/<int:run_id>/": "view",
    "runs/<int:run_id>/live": "view",
    "runs/<int:run_id>/timeline": "view",
    "runs/<int:run_id>/spans/<int:span_id>/children": "view",
    "runs/<int:run_id>/spans/<int:span_id>/payload": "view",
    "runs/<int:run_id>/artifacts/<int:artifact_id>": "view",
    "runs/<int:run_id>/cancel": "operate",
    "runs/<int:run_id>/resume": "operate",
    "runs/<int:run_id>/compensate": "operate",
    "runs/<int:run_id>/tasks/<int:task_id>/retry": "operate",
    "runs/<int:run_id>/fork": "operate",
    "runs/<int:run_id>/operations/<int:operation_id>/resolve": "operate",
    "runs/<int:run_id>/blackboard/<int:entry_id>/decide": "operate",
    "runs/<int:run_id>/annotate": "decide (POST)",
    "runs/<int:run_id>/eval-case": "curate (POST), in the run's and the suite's project",
    "insight/": "member (their projects' figures)",
    "evals/": "member (their projects' suites)",
    "evals/new": "administer, in any project (its form offers only the projects they administer)",
    "evals/<int:suite_id>/": "view, in the suite's project",
    "evals/<int:suite_id>/run": "start (POST), in the suite's project",
    "replays/": "member (their projects' replays)",
    "replays/new": "operate, in any project (a draft's edits: administer, in the runs' project, on POST)",
    "replays/<int:replay_id>/": "view, in the replay's project",
    "replays/<int:replay_id>/runs/<int:original_id>": "view, in the replay's project",
    # Operating Warden (tests/runs/test_operations.py): probes for load balancers, Prometheus' scrape (its
    # token or an allowed address; the test client's 127.0.0.1 is allowed by default), the workers.
    "healthz": "public",
    "readyz": "public",
    "metrics": "public (its token or an allowed address)",
    "workers/": "operate, in any project (workers are shared by all; tasks shown only of their projects)",
}


def _pages(patterns=None, prefix=""):
    from django.urls import URLResolver, get_resolver

    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(pattern.pattern)
        # The admin and the API have their own tables; the OTLP ingest (v1/traces) takes API tokens only
        # (tests/security/test_sweeps.py, tests/integrations/test_otlp_ingest.py).
        if route.lstrip("^").startswith(("admin/", "api/", "v1/")):
            continue
        if isinstance(pattern, URLResolver):
            yield from _pages(pattern.url_patterns, route)
        else:
            yield route


def test_every_page_has_a_row_in_the_policy_table(db):
    assert set(_pages()) == set(PAGES)


def test_member_pages_need_a_login_and_show_an_outsider_nothing(scene, client):
    for route in ("/approvals/", "/approvals/new"):
        response = client.get(route)
        assert response.status_code == 302 and response["Location"].startswith("/login/")
    client.force_login(scene["people"]["outsider"])
    assert f"request-{scene['approval'].id}" not in client.get("/approvals/").content.decode()
    decided = client.post(
        f"/approvals/{scene['approval'].id}/decide", {"decision": "approve", "arguments_hash": "a" * 64}
    )
    assert decided.status_code == 404 and "does not exist" in decided.content.decode()
    assert scene["approval"].summary not in decided.content.decode()  # not even what it was about
    assert ApprovalRequest.objects.get(id=scene["approval"].id).status == "pending"
    assert client.get(f"/approvals/{scene['approval'].id}/decide").status_code == 405
    client.logout()
    anonymous = client.post(f"/approvals/{scene['approval'].id}/decide", {"decision": "approve"})
    assert anonymous.status_code == 302 and ApprovalRequest.objects.get(id=scene["approval"].id).status == "pending"


SOCKETS = {
    "ws/inbox/": "member: joins the inbox groups of the projects they may view (nudges only, no content)",
    "ws/runs/": "member: joins the list groups of the projects they may view",
    "ws/runs/<int:run_id>/": "view the run",
}


def test_every_websocket_route_has_a_row():
    """Websockets are checked like pages (tests/runs/test_consumers.py): a new route needs a row here."""
    from config.asgi import application
    from config.routing import websocket_urlpatterns

    assert set(application.application_mapping) == {"http", "websocket"}
    assert {str(p.pattern) for p in websocket_urlpatterns} == set(SOCKETS)


def test_a_token_used_by_an_agent_never_decides(scene, client):
    from tenancy.models import ApiToken

    with pytest.raises(ValueError, match="never has the approve or admin scope"):
        api_token_create(user=scene["people"]["admin"], scopes=["read", "approve"], for_agent=True)
    token, raw = api_token_create(user=scene["people"]["admin"], for_agent=True)
    ApiToken.objects.filter(id=token.id).update(scopes=["read", "approve"])  # edited behind the service's back
    response = _call(client, raw, "POST", "/api/v1/approvals/{approval_id}/decision", scene["ids"])
    assert response.status_code == 403 and "agent" in response.json()["message"]
    assert ApprovalRequest.objects.get(id=scene["approval"].id).status == "pending"


def _page_rule(rule: str) -> tuple[str, str | None]:
    """A PAGES row as (method, action): action None = any logged-in member, "public" = anyone."""
    method = "POST" if "(POST)" in rule else "GET"
    if rule.startswith("public"):
        return method, "public"
    if rule.startswith("member"):
        return method, None
    return method, rule.split()[0].rstrip(",")


def _page_url(route: str, ids: dict) -> str:
    import re

    return "/" + re.sub(r"<(?:int|str|slug):(\w+)>", lambda m: str(ids[m.group(1)]), route)


@pytest.mark.parametrize("who", ["anonymous", "outsider", "viewer", "operator", "reviewer", "admin"])
def test_every_page_answers_each_role_as_its_row_says(scene, client, who):
    """Each GET page of the table, opened by each principal with ids of a run of the default project:
    anonymous is sent to log in, a member of another project gets 404 (as if it did not exist), a role
    without the row's action gets 403, and the others get the page. A POST row's GET is at most a form
    (what its POST needs is checked by the tests of each action)."""
    from approvals.links import decision_link
    from runs.models import Span

    run = scene["run"]
    suite = EvalSuite.objects.create(slug="s", name="s", project=run.project)
    ids = {
        "run_id": run.id,
        "task_id": run.tasks.first().id,
        "span_id": Span.objects.filter(run=run).first().id,
        "artifact_id": scene["artifact"].id,
        "operation_id": scene["op"].id,
        "entry_id": scene["entry"].id,
        "suite_id": suite.id,
        "request_id": scene["approval"].id,
        "token": decision_link(scene["approval"]).rsplit("/", 1)[1],
        "what": "tool",
        "name": "crm.read",
        "project": run.project.slug,
        "question_id": scene["ids"]["question_id"],
        "change_id": scene["change"].id,
        "replay_id": scene["ids"]["replay_id"],
        "original_id": run.id,
    }
    # The replay's one pair: the scene's run, standing in as its own replay (the pages only read them).
    ReplayRun.objects.create(replay_id=ids["replay_id"], original=run, run=run)
    if who != "anonymous":
        client.force_login(scene["people"][who])
    checked = 0
    for route, rule in PAGES.items():
        method, action = _page_rule(rule)
        url = _page_url(route, ids)
        if method == "POST":  # its GET is a form at most (the GET sweep shows no GET changes anything)
            status = client.get(url).status_code
            anonymous_ok = {302, 405} if action == "public" else {302}
            assert status in (anonymous_ok if who == "anonymous" else {200, 302, 405}), (url, who, status)
            continue
        status = client.get(url).status_code
        scoped = "<int:" in route or "<str:token>" in route
        if action == "public":
            expected = {200, 302}
        elif who == "anonymous":
            expected = {302}
        elif scoped and who == "outsider":
            expected = {404}
        elif action is None or action in ALLOWED.get(who, ()) or who == "outsider":
            expected = {200}
        else:
            expected = {403}
        assert status in expected, (url, who, status, rule)
        checked += 1
    assert checked >= 15
