"""The ledger, compensation, approvals and sandbox-effects endpoints as an integrator sees them: bearer
tokens, project roles and token scopes for the actions, the error shape {code, message, errors[{field, message}]},
a refused request that changes nothing, and an audit row for every refusal."""

import time
from datetime import datetime

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from policy.models import ApprovalRequest, Decision
from policy.services import approval_request_for_operations
from runs.models import Outbox, Run
from runs.services import run_start
from runs.services.outbox import forgetter
from runs.services.runs import run_transition
from tenancy.access import default_project, membership_grant
from tenancy.models import AuditEvent, Project
from tenancy.tokens import api_token_create
from tests.conftest import wait_for
from tests.runs.test_engine import finished
from tests.tools.test_ledger import fault, idle, stopped
from tools.installation import run_key_prefix
from tools.models import SandboxCall, SandboxEmail, SandboxTicket, ToolOperation

OS = ToolOperation.Status
# endpoint action → the access action it needs (tenancy.access.ACTIONS) and the status it answers with
ACTIONS = {"compensate": "operate", "resolve": "operate", "decide": "decide"}
DONE = {"compensate": 202, "resolve": 200, "decide": 200}
ALL_SCOPES = ["read", "run", "operate", "approve"]
ROLES = {  # role → the endpoint actions it allows
    "viewer": set(),
    "operator": {"compensate", "resolve"},
    "reviewer": {"decide"},
    "admin": {"compensate", "resolve", "decide"},
}


# --- clients -------------------------------------------------------------------------------------------


class Api:
    """The integration API with one user's token."""

    def __init__(self, client, token: str | None, user=None):
        self.client, self.token, self.user = client, token, user

    def __call__(self, method: str, path: str, body=None, **query):
        headers = {"HTTP_AUTHORIZATION": f"Bearer {self.token}"} if self.token else {}
        if method == "post":
            return self.client.post(f"/api/v1{path}", data=body or {}, content_type="application/json", **headers)
        return self.client.get(f"/api/v1{path}", query, **headers)

    def denials(self) -> list[tuple[str, str, str]]:
        """(action, target, why) of every refusal the audit log holds for this user, oldest first."""
        rows = AuditEvent.objects.filter(actor=self.user, outcome="denied").order_by("id")
        assert all(r.via == "api" and r.actor_label == self.user.get_username() for r in rows), list(rows)
        return [(r.action, r.target, r.detail.get("why", "")) for r in rows]


def member(client, username: str, role: str, *, scopes=None, project: Project | None = None) -> Api:
    """A user with ``role`` in ``project`` (the default one) and a token with ``scopes`` (the default ones)."""
    user = get_user_model().objects.create_user(username=username, password=f"{username}-pass-123")
    membership_grant(user=user, project=project or default_project(), role=role)
    return Api(client, api_token_create(user=user, scopes=scopes)[1], user)


@pytest.fixture
def anonymous(client):
    return Api(client, None)


@pytest.fixture
def viewer(client, db):
    """A viewer of the default project with a default token (read, run, operate): may read, may not act."""
    return member(client, "vera", "viewer")


@pytest.fixture
def operating(client, db):
    """An operator of the default project with a default token: compensates and resolves, never decides."""
    return member(client, "otto", "operator")


@pytest.fixture
def reviewer(client, db):
    """A reviewer of the default project whose token may do everything: decides, never operates."""
    return member(client, "rita", "reviewer", scopes=ALL_SCOPES)


@pytest.fixture
def admin(client, db):
    """An admin of the default project whose token may do everything."""
    return member(client, "adam", "admin", scopes=ALL_SCOPES)


@pytest.fixture
def root(client, django_user_model):
    """A superuser (an admin everywhere, no membership) whose token may do everything."""
    user = django_user_model.objects.create_superuser(username="root", password="root-pass-123", email="r@x.y")
    return Api(client, api_token_create(user=user, scopes=ALL_SCOPES)[1], user)


@pytest.fixture
def elsewhere(db):
    return Project.objects.create(slug="elsewhere", name="Elsewhere")


@pytest.fixture
def outsider(client, elsewhere):
    """An admin of another project, with every scope: the default project's rows do not exist for them."""
    return member(client, "otis", "admin", scopes=ALL_SCOPES, project=elsewhere)


def assert_error(response, status: int, code: str, message: str | None = None, field: str | None = None):
    assert response.status_code == status, (response.status_code, response.content)
    body = response.json()
    assert set(body) == {"code", "message", "errors"} and body["code"] == code, body
    assert body["message"], body
    if message is not None:
        assert message in body["message"], body
    if field is not None:
        assert field in [e["field"] for e in body["errors"]], body
        assert all(e["message"] for e in body["errors"]), body
    return body


# --- a scene without workers: a run to compensate, an ambiguous operation, a pending approval ----------


def _operation(run, step: int, status: str, **extra) -> ToolOperation:
    return ToolOperation.objects.create(
        gate="allow",
        run=run,
        task=run.tasks.get(key="plan"),
        step=step,
        call_number=step,
        tool="tickets.create",
        idempotency_key=f"{run_key_prefix(run.id)}plan:{step}",
        arguments_hash="0" * 64,
        arguments={"customer_id": "c1", "title": "t"},
        tool_class="idempotent_write",
        reversibility="reversible",
        status=status,
        **extra,
    )


def _bundle(run, step: int = 4) -> tuple[ToolOperation, ApprovalRequest]:
    proposal = _operation(run, step, OS.AWAITING_APPROVAL, proposed=True, order=1)
    with transaction.atomic():
        bundle = approval_request_for_operations(
            run=run, operations=[proposal], kind=ApprovalRequest.Kind.BUNDLE, title="one proposal"
        )
    return proposal, bundle


@pytest.fixture
def scene(demo):
    """Rows the three actions act on, made with the engine's own services (no worker runs). The runs belong to
    the default project and nobody started them, so separation of duties does not apply."""
    stuck = run_start(workflow="incident-fanout")
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(id=stuck.id)
        run_transition(run=locked, to=Run.Status.NEEDS_ATTENTION, reason="worker-3 failed", now=timezone.now())
    other = run_start(workflow="incident-fanout")
    assert stuck.project == other.project == default_project()
    ambiguous = _operation(other, 2, OS.AMBIGUOUS, status_reason="no answer before the deadline")
    proposal, bundle = _bundle(other)
    return {"stuck": stuck, "other": other, "ambiguous": ambiguous, "proposal": proposal, "bundle": bundle}


def decision(request, verdict: str, note: str = "") -> dict:
    """A decision body quoting the request's arguments hash (``request``: a row or the API's dict)."""
    quoted = request["arguments_hash"] if isinstance(request, dict) else request.arguments_hash
    return {"decision": verdict, "note": note, "arguments_hash": quoted}


def bundles(api, **query) -> list[dict]:
    """The listed requests that are not an item of another (a bundle, a compensation's corrections)."""
    response = api("get", "/approvals", **query)
    assert response.status_code == 200, response.json()
    return [a for a in response.json() if a["parent"] is None]


def _action(scene, name: str):
    return {
        "compensate": ("post", f"/runs/{scene['stuck'].id}/compensate", {"reason": "undo it"}),
        "resolve": ("post", f"/operations/{scene['ambiguous'].id}/resolve", {"committed": True, "note": "seen"}),
        "decide": ("post", f"/approvals/{scene['bundle'].id}/decision", decision(scene["bundle"], "approve", "ok")),
    }[name]


def _target(scene, name: str) -> str:
    """What a refusal of the action names, in its message and its audit row."""
    return {
        "compensate": f"run {scene['stuck'].id}",
        "resolve": f"operation {scene['ambiguous'].id}",
        "decide": f"approval request {scene['bundle'].id}",
    }[name]


def _state() -> tuple:
    """Everything an action could change. Sent outbox rows are forgotten by a thread of their own: it is
    done with what it holds first, so a row it deletes late is not counted as a change."""
    forgetter.flush()
    return (
        sorted(Run.objects.values_list("id", "status", "status_reason")),
        sorted(ToolOperation.objects.values_list("id", "status", "status_reason", "kind")),
        sorted(ApprovalRequest.objects.values_list("id", "status", "decided_by_id", "note", "arguments_hash")),
        sorted(Decision.objects.values_list("id", "request_id", "reviewer_id", "verdict")),
        Outbox.objects.count(),
    )


ENDPOINTS = [
    ("get", "/runs/{run}/operations"),
    ("get", "/runs/{run}/compensation"),
    ("post", "/runs/{run}/compensate"),
    ("post", "/operations/{op}/resolve"),
    ("get", "/approvals"),
    ("post", "/approvals/{approval}/decision"),
    ("get", "/sandbox/effects"),
]


@pytest.mark.parametrize("method, path", ENDPOINTS)
@pytest.mark.parametrize("header", [None, "Bearer wdn_not-a-real-token"])
def test_every_endpoint_needs_a_valid_token_and_a_refusal_changes_nothing(scene, client, method, path, header):
    before = _state()
    url = path.format(run=scene["stuck"].id, op=scene["ambiguous"].id, approval=scene["bundle"].id)
    headers = {"HTTP_AUTHORIZATION": header} if header else {}
    if method == "post":
        body = {"committed": True} if "resolve" in url else {"decision": "approve"} if "decision" in url else {}
        response = client.post(f"/api/v1{url}", data=body, content_type="application/json", **headers)
    else:
        response = client.get(f"/api/v1{url}", **headers)
    assert_error(response, 401, "unauthenticated")
    assert _state() == before


# --- roles and scopes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_a_viewer_may_read_but_not_act_and_a_refusal_changes_nothing(scene, viewer, action):
    before = _state()
    method, path, body = _action(scene, action)
    target = _target(scene, action)
    message = f"your role in this project (viewer) may not {ACTIONS[action]} {target}"
    assert_error(viewer(method, path, body), 403, "forbidden", message)
    assert _state() == before
    assert viewer.denials() == [(f"denied:{ACTIONS[action]}", target, "role viewer")]
    assert AuditEvent.objects.get(actor=viewer.user).project_id == default_project().id

    # reading is what a viewer may do
    other, stuck = scene["other"].id, scene["stuck"].id
    operations = viewer("get", f"/runs/{other}/operations")
    assert operations.status_code == 200
    assert [o["id"] for o in operations.json()] == [scene["ambiguous"].id, scene["proposal"].id]
    assert viewer("get", f"/runs/{stuck}/compensation").status_code == 200
    item = scene["proposal"].approval_id
    assert [(a["id"], a["parent"]) for a in viewer("get", "/approvals").json()] == [
        (scene["bundle"].id, None),
        (item, scene["bundle"].id),
    ]
    assert viewer("get", "/sandbox/effects").json() == {"effects": [], "next_after": None}
    assert len(viewer.denials()) == 1 and _state() == before


@pytest.mark.parametrize("role", sorted(ROLES))
def test_a_role_allows_its_own_actions_and_no_other(scene, client, role):
    """The token has every scope, so what is refused is refused for the role alone."""
    api = member(client, f"{role}-1", role, scopes=ALL_SCOPES)
    expected_denials = []
    for action in sorted(ACTIONS):
        before = _state()
        response = api(*_action(scene, action))
        if action in ROLES[role]:
            assert response.status_code == DONE[action], response.json()
            assert _state() != before
            continue
        target = _target(scene, action)
        assert_error(
            response, 403, "forbidden", f"your role in this project ({role}) may not {ACTIONS[action]} {target}"
        )
        assert _state() == before
        expected_denials.append((f"denied:{ACTIONS[action]}", target, f"role {role}"))
        assert api.denials() == expected_denials
    assert len(expected_denials) == len(ACTIONS) - len(ROLES[role])


@pytest.mark.parametrize("who", ["admin", "root"])
def test_as_a_project_admin_or_a_superuser_the_actions_work(scene, request, who):
    api = request.getfixturevalue(who)
    username = api.user.get_username()

    resolved = api(*_action(scene, "resolve"))
    assert resolved.status_code == 200, resolved.json()
    assert resolved.json()["status"] == OS.COMMITTED
    assert resolved.json()["status_reason"] == "resolved by an operator: committed (seen)"
    assert ToolOperation.objects.get(id=scene["ambiguous"].id).status == OS.COMMITTED

    decided = api(*_action(scene, "decide"))
    assert decided.status_code == 200, decided.json()
    body = decided.json()
    assert (body["status"], body["decided_by"], body["note"]) == ("approved", username, "ok")
    assert body["operations"] == [scene["proposal"].id] and body["run"] == scene["other"].id
    assert ToolOperation.objects.get(id=scene["proposal"].id).status == OS.APPROVED

    compensated = api(*_action(scene, "compensate"))
    assert compensated.status_code == 202, compensated.json()
    assert compensated.json()["status"] == Run.Status.COMPENSATING
    assert compensated.json()["status_reason"] == "undo it"
    assert Run.objects.get(id=scene["stuck"].id).status == Run.Status.COMPENSATING

    # each action is in the audit log under its user, and none was refused
    done = AuditEvent.objects.filter(actor=api.user, outcome="done").values_list("action", "target")
    assert sorted(done) == sorted(
        [
            ("operation_resolve", _target(scene, "resolve")),
            ("decide:approve", _target(scene, "decide")),
            ("run_compensate", _target(scene, "compensate")),
        ]
    )
    assert api.denials() == []


@pytest.mark.parametrize(
    "role, scopes, action, scope",
    [
        ("reviewer", None, "decide", "approve"),  # a default token: read, run, operate
        ("admin", None, "decide", "approve"),
        ("superuser", None, "decide", "approve"),
        ("reviewer", ["read"], "decide", "approve"),
        ("operator", ["read", "run"], "compensate", "operate"),
        ("operator", ["read", "approve"], "resolve", "operate"),
    ],
)
def test_a_token_without_the_scope_an_action_needs_is_forbidden(
    scene, client, django_user_model, role, scopes, action, scope
):
    if role == "superuser":
        user = django_user_model.objects.create_superuser(username="su", password="su-pass-123", email="s@x.y")
        api = Api(client, api_token_create(user=user, scopes=scopes)[1], user)
    else:
        api = member(client, f"{role}-1", role, scopes=scopes)
    before = _state()
    target = _target(scene, action)
    message = f"this API token lacks the {scope!r} scope needed to {ACTIONS[action]} {target}"
    assert_error(api(*_action(scene, action)), 403, "forbidden", message)
    assert _state() == before
    assert api.denials() == [(f"denied:{ACTIONS[action]}", target, f"token without the {scope} scope")]
    # the same user with a token that has the scope (and read, to see the answer) may
    allowed = Api(client, api_token_create(user=api.user, scopes=["read", scope])[1], api.user)
    assert allowed(*_action(scene, action)).status_code == DONE[action]
    assert len(api.denials()) == 1


def test_a_token_that_may_operate_but_not_read_either_compensates_or_changes_nothing(scene, client):
    """A 403 must never come back for a compensation that has started: a token that may operate a run gets
    the 202 with the run it compensated."""
    api = member(client, "operate-only", "operator", scopes=["operate"])
    before = _state()
    response = api(*_action(scene, "compensate"))
    if response.status_code == 403:
        assert _state() == before, "a 403 answer, yet the run is compensating"
    else:
        assert response.status_code == 202, response.json()


def test_listing_approvals_needs_the_read_scope(scene, client):
    """Like every other read, listing approval requests (summaries with arguments) needs the read scope."""
    api = member(client, "approve-only", "reviewer", scopes=["approve"])
    assert_error(api("get", f"/runs/{scene['other'].id}/operations"), 403, "forbidden", "'read' scope")
    assert_error(api("get", "/approvals"), 403, "forbidden", "'read' scope")


def test_a_member_of_another_project_finds_nothing_of_this_one(scene, outsider, elsewhere):
    """Not a member: every row of the default project answers 404 exactly as a row that does not exist."""
    own = run_start(workflow="incident-fanout", project=elsewhere)
    _, own_bundle = _bundle(own)
    before = _state()
    run, stuck, op, bundle = scene["other"].id, scene["stuck"].id, scene["ambiguous"].id, scene["bundle"].id
    attempts = [
        (("get", f"/runs/{run}/operations"), "view", f"run {run}"),
        (("get", f"/runs/{stuck}/compensation"), "view", f"run {stuck}"),
        (_action(scene, "compensate"), "operate", f"run {stuck}"),
        (_action(scene, "resolve"), "operate", f"operation {op}"),
        (_action(scene, "decide"), "decide", f"approval request {bundle}"),
    ]
    for request, action, target in attempts:
        body = assert_error(outsider(*request), 404, "not_found")
        assert body == {"code": "not_found", "message": f"{target} does not exist", "errors": []}
        assert outsider.denials()[-1] == (f"denied:{action}", target, "not a member")
    assert _state() == before
    assert len(outsider.denials()) == len(attempts)
    assert {e.project_id for e in AuditEvent.objects.filter(actor=outsider.user)} == {default_project().id}

    # the approvals list holds their own project's requests only, whatever the filter
    assert [a["run"] for a in outsider("get", "/approvals").json()] == [own.id, own.id]  # the bundle, its item
    assert [a["id"] for a in bundles(outsider)] == [own_bundle.id]
    assert outsider("get", "/approvals", run=run).json() == []
    assert outsider("get", "/approvals", status="pending", run=run).json() == []
    # and their own project's rows are theirs to act on
    assert outsider("get", f"/runs/{own.id}/operations").status_code == 200
    decided = outsider("post", f"/approvals/{own_bundle.id}/decision", decision(own_bundle, "reject", "not now"))
    assert decided.status_code == 200 and decided.json()["status"] == "rejected", decided.json()
    assert ApprovalRequest.objects.get(id=bundle).status == ApprovalRequest.Status.PENDING


def test_resolving_twice_or_an_unknown_operation_is_refused(scene, operating, reviewer):
    assert operating(*_action(scene, "resolve")).status_code == 200
    before = _state()
    again = operating(*_action(scene, "resolve"))
    assert_error(again, 409, "conflict", f"operation {scene['ambiguous'].id} is committed")
    unknown = operating("post", "/operations/999999/resolve", {"committed": False})
    assert_error(unknown, 404, "not_found", "operation 999999 does not exist")
    assert_error(operating("post", "/runs/999999/compensate", {}), 404, "not_found", "run 999999 does not exist")
    unknown = reviewer(
        "post", "/approvals/999999/decision", {"decision": "reject", "note": "x", "arguments_hash": "0" * 64}
    )
    assert_error(unknown, 404, "not_found", "approval request 999999 does not exist")
    assert _state() == before


@pytest.mark.parametrize(
    "action, body, field",
    [
        ("compensate", {"reason": 5}, "reason"),
        ("compensate", {"reason": "x" * 1001}, "reason"),
        ("resolve", {"committed": "perhaps"}, "committed"),
        ("resolve", {"note": "no verdict"}, "committed"),
        ("decide", {"decision": "maybe"}, "decision"),
        ("decide", {}, "decision"),
        ("decide", {"decision": "approve", "note": ["not", "text"], "arguments_hash": "0" * 64}, "note"),
        ("decide", {"decision": "approve", "note": "ok"}, "arguments_hash"),
        ("decide", {"decision": "approve", "arguments_hash": "0" * 63}, "arguments_hash"),
    ],
)
def test_bad_input_answers_422_with_field_errors_and_changes_nothing(scene, admin, action, body, field):
    before = _state()
    method, path, _ = _action(scene, action)
    assert_error(admin(method, path, body), 422, "invalid_input", "the request is invalid", field)
    assert _state() == before


@pytest.mark.parametrize(
    "path, query, field",
    [
        ("/sandbox/effects", {"limit": 0}, "limit"),
        ("/sandbox/effects", {"after": -1}, "after"),
        ("/sandbox/effects", {"limit": "many"}, "limit"),
        ("/approvals", {"status": "maybe"}, "status"),
        ("/runs/abc/operations", {}, "run_id"),
    ],
)
def test_bad_query_parameters_answer_422_with_field_errors(scene, viewer, path, query, field):
    assert_error(viewer("get", path, **query), 422, "invalid_input", "the request is invalid", field)


# --- the ledger of a real run ----------------------------------------------------------------------------

WORKER_CALLS = ["crm.read", "tickets.create", "crm.update", "email.send"]


def test_the_ledger_of_a_finished_incident_fanout_run(demo_tx, worker, viewer):
    run = finished(run_start(workflow="incident-fanout"))
    assert run.status == Run.Status.COMPLETED, run.status_reason

    response = viewer("get", f"/runs/{run.id}/operations")
    assert response.status_code == 200
    ops = response.json()
    assert [o["id"] for o in ops] == sorted(o["id"] for o in ops)
    assert len(ops) == 20 == ToolOperation.objects.filter(run=run).count()  # five workers, four calls each
    for n in range(1, 6):
        mine = sorted((o for o in ops if o["task"] == f"worker-{n}"), key=lambda o: o["step"])
        assert [o["tool"] for o in mine] == WORKER_CALLS
        # the key is run, task and journal step: what a retry of the same step would use again
        assert [o["idempotency_key"] for o in mine] == [f"{run_key_prefix(run.id)}worker-{n}:{o['step']}" for o in mine]
        assert [o["tool_class"] for o in mine] == [
            "read_only",
            "idempotent_write",
            "idempotent_write",
            "non_idempotent_write",
        ]
        assert [o["reversibility"] for o in mine] == ["", "reversible", "reversible", "irreversible"]
    assert {o["status"] for o in ops} == {OS.COMMITTED}
    assert {o["kind"] for o in ops} == {"action"} and not any(o["proposed"] for o in ops)
    assert len({o["idempotency_key"] for o in ops}) == 20
    tickets = {o["external_id"] for o in ops if o["tool"] == "tickets.create"}
    assert tickets == set(SandboxTicket.objects.values_list("ticket_id", flat=True))
    for o in ops:
        assert o["attempts"] == 1 and o["committed_at"] and o["ended_at"] and o["result"] is not None
        datetime.fromisoformat(o["created_at"])
    # the undo each reversible write recorded with its receipt
    closes = [o["compensation"] for o in ops if o["tool"] == "tickets.create"]
    assert {(c["kind"], c["tool"]) for c in closes} == {("compensation", "tickets.close")}

    assert viewer("get", "/runs/999999/operations").json() == {
        "code": "not_found",
        "message": "run 999999 does not exist",
        "errors": [],
    }
    assert_error(viewer("get", "/runs/999999/compensation"), 404, "not_found", "run 999999 does not exist")


def test_compensating_a_completed_run_is_a_conflict_and_changes_nothing(demo_tx, worker, operating):
    run = finished(run_start(workflow="incident-fanout"))
    assert run.status == Run.Status.COMPLETED, run.status_reason
    before = _state(), sorted(SandboxTicket.objects.values_list("id", "status")), SandboxCall.objects.count()
    body = assert_error(operating("post", f"/runs/{run.id}/compensate", {}), 409, "conflict")
    assert body["message"] == (
        f"run {run.id} is completed; only a run that needs attention, failed or was cancelled can be compensated "
        "(cancel a running run first)"
    )
    after = _state(), sorted(SandboxTicket.objects.values_list("id", "status")), SandboxCall.objects.count()
    assert after == before


def test_compensation_preview_then_compensate_through_the_api(demo_tx, worker, operating, reviewer, viewer):
    run = finished(run_start(workflow="incident-fanout", input=fault("error")))
    assert run.status == Run.Status.NEEDS_ATTENTION, run.status_reason
    idle(run)  # a sibling attempt may still be in flight; compensate once none is running
    prefix = run_key_prefix(run.id)
    tickets = SandboxTicket.objects.filter(idempotency_key__startswith=prefix)
    sent = SandboxEmail.objects.filter(idempotency_key__startswith=prefix).count()
    assert tickets.exists() and sent < 5  # worker-3's e-mail was refused

    preview = viewer("get", f"/runs/{run.id}/compensation")
    assert preview.status_code == 200
    plan = preview.json()
    assert plan["unresolved"] == [] and plan["cannot_undo"] == []
    undo, correct = plan["undo"], plan["correct"]
    assert len(undo) == 2 * tickets.count() and len(correct) == sent
    committed = [datetime.fromisoformat(u["committed_at"]) for u in undo]
    assert committed == sorted(committed, reverse=True)  # reverse commit order
    assert {u["action"] for u in undo} == {"tickets.close", "crm.restore"}
    assert not any(u["needs_approval"] for u in undo)
    assert correct and all(c["needs_approval"] and c["action"] == "email.send" for c in correct)
    assert all(c["arguments"]["subject"].startswith("Correction: ") for c in correct)
    closes = {u["arguments"]["ticket_id"] for u in undo if u["action"] == "tickets.close"}
    assert closes == set(tickets.values_list("ticket_id", flat=True))

    # bad input first: refused, nothing starts
    before = _state()
    assert_error(operating("post", f"/runs/{run.id}/compensate", {"reason": 5}), 422, "invalid_input", field="reason")
    assert _state() == before and viewer("get", f"/runs/{run.id}/compensation").json() == plan

    started = operating("post", f"/runs/{run.id}/compensate", {"reason": "roll back the incident run"})
    assert started.status_code == 202, started.json()
    assert started.json()["status"] == Run.Status.COMPENSATING
    assert started.json()["status_reason"] == "roll back the incident run"

    # undo runs at once; corrections wait for a reviewer (approved below, through the API)
    ops = ToolOperation.objects.filter(run=run)
    wait_for(lambda: not ops.exclude(kind="action").filter(status__in=[OS.APPROVED, OS.EXECUTING]).exists())
    assert set(tickets.values_list("status", flat=True)) == {"closed"}
    [pending] = bundles(viewer, run=run.id)
    assert (pending["kind"], pending["status"], len(pending["operations"]), len(pending["items"])) == (
        "correction",
        "pending",
        sent,
        sent,
    )
    # the operator who asked for the compensation may not decide its corrections; a reviewer may
    correction = pending["id"]
    before = _state()
    refused = operating("post", f"/approvals/{correction}/decision", decision(pending, "approve"))
    assert_error(refused, 403, "forbidden", "your role in this project (operator) may not decide approval request")
    assert _state() == before
    assert operating.denials() == [("denied:decide", f"approval request {correction}", "role operator")]
    decided = reviewer("post", f"/approvals/{correction}/decision", decision(pending, "approve"))
    assert decided.status_code == 200, decided.json()
    assert (decided.json()["status"], decided.json()["decided_by"]) == ("approved", "rita")
    run = stopped(run, {Run.Status.COMPENSATED, Run.Status.NEEDS_ATTENTION})
    assert run.status == Run.Status.COMPENSATED, run.status_reason
    assert SandboxEmail.objects.filter(kind="correction").count() == sent

    # a compensated run cannot be compensated again, and the refusal changes nothing
    before = _state()
    again = operating("post", f"/runs/{run.id}/compensate", {})
    assert_error(again, 409, "conflict", f"run {run.id} is compensated; only a run that needs attention")
    assert _state() == before


# --- approvals ---------------------------------------------------------------------------------------


def _start_proposing(api) -> Run:
    """Start, through the API, a run whose e-mails are proposals, and wait for their bundle."""
    started = api("post", "/runs", {"workflow": "incident-fanout", "input": {"propose_tools": ["email.send"]}})
    assert started.status_code == 201, started.json()
    assert started.json()["project"] == "default"
    run = Run.objects.get(id=started.json()["id"])
    assert run.started_by == api.user
    run = stopped(run, {Run.Status.WAITING_FOR_APPROVAL, Run.Status.COMPLETED, Run.Status.NEEDS_ATTENTION})
    assert run.status == Run.Status.WAITING_FOR_APPROVAL, run.status_reason
    # The worker's commit is seen here before its after-commit send may have run: wait for the outbox to be
    # empty, so the states the tests compare start from a quiet one.
    deadline = time.monotonic() + 10
    while Outbox.objects.exists() and time.monotonic() < deadline:
        forgetter.flush()
        time.sleep(0.01)
    return run


def test_a_bundle_of_proposals_is_listed_and_approved_once_through_the_api(
    demo_tx, worker, operating, viewer, reviewer
):
    run = _start_proposing(operating)  # started by an operator, decided by a reviewer

    [bundle] = [a for a in bundles(viewer) if a["run"] == run.id]  # pending ones by default
    proposals = ToolOperation.objects.filter(run=run, tool="email.send")
    assert (bundle["kind"], bundle["status"], bundle["task"], bundle["decided_by"]) == ("bundle", "pending", None, None)
    assert bundle["operations"] == sorted(proposals.values_list("id", flat=True)) and len(bundle["operations"]) == 5
    assert "5 proposed operations" in bundle["summary"] and "email.send" in bundle["summary"]
    assert len(bundle["items"]) == 5 and bundle["quorum"] == 1 and bundle["decisions"] == []
    assert bundles(viewer, run=run.id) == [bundle]
    assert viewer("get", "/approvals", status="approved").json() == []
    assert not SandboxEmail.objects.exists()

    # a decision nobody can parse changes nothing
    before = _state()
    maybe = reviewer("post", f"/approvals/{bundle['id']}/decision", decision(bundle, "maybe"))
    assert_error(maybe, 422, "invalid_input", field="decision")
    assert _state() == before

    decided = reviewer("post", f"/approvals/{bundle['id']}/decision", decision(bundle, "approve", "send them"))
    assert decided.status_code == 200, decided.json()
    assert (decided.json()["status"], decided.json()["decided_by"]) == ("approved", "rita")
    run = finished(run)
    assert run.status == Run.Status.COMPLETED, run.status_reason
    emails = SandboxEmail.objects.filter(idempotency_key__startswith=run_key_prefix(run.id))
    assert emails.count() == 5 == SandboxEmail.objects.count()
    assert len(set(emails.values_list("idempotency_key", flat=True))) == 5
    assert set(proposals.values_list("status", flat=True)) == {OS.COMMITTED}

    before = _state()
    again = reviewer("post", f"/approvals/{bundle['id']}/decision", decision(bundle, "reject", "too late"))
    conflict = f"approval request {bundle['id']} is approved; it cannot be decided again"
    assert_error(again, 409, "conflict", conflict)
    assert _state() == before and SandboxEmail.objects.count() == 5
    assert reviewer.denials() == [("decide", f"approval request {bundle['id']}", conflict)]
    assert [a["id"] for a in bundles(viewer, status="approved")] == [bundle["id"]]


def test_whoever_started_a_run_may_not_decide_its_approvals(demo_tx, worker, admin, reviewer, viewer):
    """Separation of duties: an admin whose token has the approve scope started the run, so they may not decide
    its proposals; another reviewer may."""
    run = _start_proposing(admin)
    [bundle] = bundles(viewer, run=run.id)
    target = f"approval request {bundle['id']}"

    before = _state()
    for verdict in ("approve", "reject"):
        refused = admin("post", f"/approvals/{bundle['id']}/decision", decision(bundle, verdict, "mine"))
        assert_error(refused, 403, "forbidden", "separation of duties")
    assert _state() == before and not SandboxEmail.objects.exists()
    row = ApprovalRequest.objects.get(id=bundle["id"])
    assert (row.status, row.decided_by, row.decided_at, row.note) == (ApprovalRequest.Status.PENDING, None, None, "")
    assert bundles(viewer, run=run.id) == [bundle]
    why = "separation of duties: whoever started a run cannot approve or reject its actions"
    assert admin.denials() == [("decide", target, why)] * 2
    assert set(AuditEvent.objects.filter(actor=admin.user, outcome="denied").values_list("run_id", flat=True)) == {
        run.id
    }

    decided = reviewer("post", f"/approvals/{bundle['id']}/decision", decision(bundle, "approve"))
    assert decided.status_code == 200, decided.json()
    assert (decided.json()["status"], decided.json()["decided_by"]) == ("approved", "rita")
    run = finished(run)
    assert run.status == Run.Status.COMPLETED, run.status_reason
    assert SandboxEmail.objects.count() == 5 and reviewer.denials() == []


# --- sandbox effects ---------------------------------------------------------------------------------


def _all_pages(api, limit: int, **query) -> tuple[list[dict], int]:
    effects, after, pages = [], 0, 0
    while True:
        page = api("get", "/sandbox/effects", after=after, limit=limit, **query)
        assert page.status_code == 200, page.json()
        body = page.json()
        assert len(body["effects"]) <= limit
        effects += body["effects"]
        pages += 1
        if body["next_after"] is None:
            return effects, pages
        assert body["next_after"] == body["effects"][-1]["id"]
        after = body["next_after"]


def test_sandbox_effects_filter_by_run_and_page(demo_tx, worker, viewer):
    first, second = (run_start(workflow="incident-fanout") for _ in range(2))
    for run in (finished(first), finished(second)):
        assert run.status == Run.Status.COMPLETED, run.status_reason

    everything = viewer("get", "/sandbox/effects").json()
    assert everything["next_after"] is None
    rows = everything["effects"]
    # 5 tickets, 5 record updates and 5 e-mails per run; reads are not effects
    assert len(rows) == 30 == SandboxCall.objects.filter(is_effect=True).count()
    assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)
    for r in rows:
        assert set(r) == {"id", "system", "kind", "tool", "idempotency_key", "object_id", "at"}
        assert r["kind"].split(".")[0] == r["system"] and r["idempotency_key"].startswith("warden:")
        datetime.fromisoformat(r["at"])

    prefix = run_key_prefix(first.id)
    mine = viewer("get", "/sandbox/effects", key_prefix=prefix).json()["effects"]
    assert len(mine) == 15 and all(r["idempotency_key"].startswith(prefix) for r in mine)
    assert sorted(r["kind"] for r in mine) == sorted(["tickets.create", "crm.update", "email.send"] * 5)
    emails = viewer("get", "/sandbox/effects", key_prefix=prefix, system="email").json()["effects"]
    assert [r["kind"] for r in emails] == ["email.send"] * 5

    assert viewer("get", "/sandbox/effects", run=first.id).json()["effects"] == mine
    # The prefix documented before keys named the installation still means that run (deprecated)
    assert viewer("get", "/sandbox/effects", key_prefix=f"warden:{first.id}:").json()["effects"] == mine
    assert prefix.startswith("warden:itest:")  # the test settings' installation id
    paged, pages = _all_pages(viewer, 4, key_prefix=prefix)
    assert paged == mine and pages == 4  # 4 + 4 + 4 + 3, no duplicates, none missed
    paged, pages = _all_pages(viewer, 15, key_prefix=prefix)
    assert paged == mine and pages == 1  # an exact fit needs no second page
    assert viewer("get", "/sandbox/effects", after=rows[-1]["id"]).json() == {"effects": [], "next_after": None}


def test_sandbox_effects_are_not_served_where_sandbox_tools_are_off(db, viewer):
    assert viewer("get", "/sandbox/effects").status_code == 200
    with override_settings(WARDEN={**settings.WARDEN, "SANDBOX_TOOLS": False}):
        response = viewer("get", "/sandbox/effects")
    assert_error(response, 404, "not_found", "the sandbox systems are not enabled here")
