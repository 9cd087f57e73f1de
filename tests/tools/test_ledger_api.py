"""The ledger, compensation, approvals and sandbox-effects endpoints as an integrator sees them: bearer
tokens, Django permissions for the actions, the error shape {code, message, errors[{field, message}]}, and a
refused request that changes nothing."""

from datetime import datetime

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from approvals.models import ApprovalRequest
from approvals.services import approval_request_for_operations
from approvals.tokens import api_token_create
from runs.models import Outbox, Run
from runs.services import run_start
from runs.services.runs import run_transition
from tests.conftest import wait_for
from tests.runs.test_engine import finished
from tests.tools.test_ledger import fault, idle, stopped
from tools.models import SandboxCall, SandboxEmail, SandboxTicket, ToolOperation

OS = ToolOperation.Status
ACTIONS = {
    "compensate": "runs.change_run",
    "resolve": "tools.change_tooloperation",
    "decide": "approvals.change_approvalrequest",
}


# --- clients -------------------------------------------------------------------------------------------


class Api:
    """The integration API with one user's token."""

    def __init__(self, client, token: str | None):
        self.client, self.token = client, token

    def __call__(self, method: str, path: str, body=None, **query):
        headers = {"HTTP_AUTHORIZATION": f"Bearer {self.token}"} if self.token else {}
        if method == "post":
            return self.client.post(f"/api/v1{path}", data=body or {}, content_type="application/json", **headers)
        return self.client.get(f"/api/v1{path}", query, **headers)


def _grant(user, *permissions):
    for name in permissions:
        app_label, codename = name.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))


@pytest.fixture
def anonymous(client):
    return Api(client, None)


@pytest.fixture
def viewer(client, operator):
    """A known user without any permission: may read, may not act."""
    return Api(client, api_token_create(user=operator)[1])


@pytest.fixture
def reviewer(client, django_user_model):
    """A user with exactly the three permissions the actions need."""
    user = django_user_model.objects.create_user(username="rita", password="reviewer-pass-123")
    _grant(user, *ACTIONS.values())
    return Api(client, api_token_create(user=user)[1])


@pytest.fixture
def root(client, django_user_model):
    user = django_user_model.objects.create_superuser(username="root", password="root-pass-123", email="r@x.y")
    return Api(client, api_token_create(user=user)[1])


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


@pytest.fixture
def scene(demo):
    """Rows the three actions act on, made with the engine's own services (no worker runs)."""
    stuck = run_start(workflow="incident-fanout")
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(id=stuck.id)
        run_transition(run=locked, to=Run.Status.NEEDS_ATTENTION, reason="worker-3 failed", now=timezone.now())
    other = run_start(workflow="incident-fanout")
    plan = other.tasks.get(key="plan")

    def op(step, status, **extra):
        return ToolOperation.objects.create(
            run=other,
            task=plan,
            step=step,
            call_number=step,
            tool="tickets.create",
            idempotency_key=f"warden:{other.id}:plan:{step}",
            arguments_hash="0" * 64,
            arguments={"customer_id": "c1", "title": "t"},
            tool_class="idempotent_write",
            reversibility="reversible",
            status=status,
            **extra,
        )

    ambiguous = op(2, OS.AMBIGUOUS, status_reason="no answer before the deadline")
    proposal = op(4, OS.AWAITING_APPROVAL, proposed=True, order=1)
    with transaction.atomic():
        bundle = approval_request_for_operations(
            run=other, operations=[proposal], kind=ApprovalRequest.Kind.BUNDLE, title="one proposal"
        )
    return {"stuck": stuck, "other": other, "ambiguous": ambiguous, "proposal": proposal, "bundle": bundle}


def _action(scene, name: str):
    return {
        "compensate": ("post", f"/runs/{scene['stuck'].id}/compensate", {"reason": "undo it"}),
        "resolve": ("post", f"/operations/{scene['ambiguous'].id}/resolve", {"committed": True, "note": "seen"}),
        "decide": ("post", f"/approvals/{scene['bundle'].id}/decision", {"decision": "approve", "note": "ok"}),
    }[name]


def _state() -> tuple:
    """Everything an action could change."""
    return (
        sorted(Run.objects.values_list("id", "status", "status_reason")),
        sorted(ToolOperation.objects.values_list("id", "status", "status_reason", "kind")),
        sorted(ApprovalRequest.objects.values_list("id", "status", "decided_by_id", "note")),
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


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_an_action_without_its_permission_is_forbidden_and_changes_nothing(scene, viewer, action):
    before = _state()
    method, path, body = _action(scene, action)
    assert_error(viewer(method, path, body), 403, "forbidden", ACTIONS[action])
    assert _state() == before
    # reading is allowed to any token holder
    assert viewer("get", f"/runs/{scene['other'].id}/operations").status_code == 200
    assert viewer("get", "/approvals").status_code == 200


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_a_permission_for_one_action_does_not_allow_another(scene, client, django_user_model, action):
    user = django_user_model.objects.create_user(username="one-perm", password="one-perm-pass-123")
    _grant(user, ACTIONS[action])
    api = Api(client, api_token_create(user=user)[1])
    for other in sorted(set(ACTIONS) - {action}):
        before = _state()
        method, path, body = _action(scene, other)
        assert_error(api(method, path, body), 403, "forbidden", ACTIONS[other])
        assert _state() == before


@pytest.mark.parametrize("who", ["reviewer", "root"])
def test_with_the_permissions_or_as_superuser_the_actions_work(scene, request, who):
    api = request.getfixturevalue(who)
    username = "rita" if who == "reviewer" else "root"

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


def test_resolving_twice_or_an_unknown_operation_is_refused(scene, reviewer):
    assert reviewer(*_action(scene, "resolve")).status_code == 200
    before = _state()
    again = reviewer(*_action(scene, "resolve"))
    assert_error(again, 409, "conflict", f"operation {scene['ambiguous'].id} is committed")
    assert_error(reviewer("post", "/operations/999999/resolve", {"committed": False}), 404, "not_found")
    assert_error(reviewer("post", "/runs/999999/compensate", {}), 404, "not_found", "run 999999 does not exist")
    assert_error(reviewer("post", "/approvals/999999/decision", {"decision": "reject"}), 404, "not_found")
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
        ("decide", {"decision": "approve", "note": ["not", "text"]}, "note"),
    ],
)
def test_bad_input_answers_422_with_field_errors_and_changes_nothing(scene, reviewer, action, body, field):
    before = _state()
    method, path, _ = _action(scene, action)
    assert_error(reviewer(method, path, body), 422, "invalid_input", "the request is invalid", field)
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
        assert [o["idempotency_key"] for o in mine] == [f"warden:{run.id}:worker-{n}:{o['step']}" for o in mine]
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


def test_compensating_a_completed_run_is_a_conflict_and_changes_nothing(demo_tx, worker, reviewer):
    run = finished(run_start(workflow="incident-fanout"))
    assert run.status == Run.Status.COMPLETED, run.status_reason
    before = _state(), sorted(SandboxTicket.objects.values_list("id", "status")), SandboxCall.objects.count()
    body = assert_error(reviewer("post", f"/runs/{run.id}/compensate", {}), 409, "conflict")
    assert body["message"] == (
        f"run {run.id} is completed; only a run that needs attention, failed or was cancelled can be compensated "
        "(cancel a running run first)"
    )
    after = _state(), sorted(SandboxTicket.objects.values_list("id", "status")), SandboxCall.objects.count()
    assert after == before


def test_compensation_preview_then_compensate_through_the_api(demo_tx, worker, reviewer, viewer):
    run = finished(run_start(workflow="incident-fanout", input=fault("error")))
    assert run.status == Run.Status.NEEDS_ATTENTION, run.status_reason
    idle(run)  # a sibling attempt may still be in flight; compensate once none is running
    prefix = f"warden:{run.id}:"
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
    assert_error(reviewer("post", f"/runs/{run.id}/compensate", {"reason": 5}), 422, "invalid_input", field="reason")
    assert _state() == before and viewer("get", f"/runs/{run.id}/compensation").json() == plan

    started = reviewer("post", f"/runs/{run.id}/compensate", {"reason": "roll back the incident run"})
    assert started.status_code == 202, started.json()
    assert started.json()["status"] == Run.Status.COMPENSATING
    assert started.json()["status_reason"] == "roll back the incident run"

    # undo runs at once; corrections wait for a reviewer (approved below, through the API)
    ops = ToolOperation.objects.filter(run=run)
    wait_for(lambda: not ops.exclude(kind="action").filter(status__in=[OS.APPROVED, OS.EXECUTING]).exists())
    assert set(tickets.values_list("status", flat=True)) == {"closed"}
    pending = viewer("get", "/approvals", run=run.id).json()
    assert [(a["kind"], a["status"], len(a["operations"])) for a in pending] == [("correction", "pending", sent)]
    decided = reviewer("post", f"/approvals/{pending[0]['id']}/decision", {"decision": "approve"})
    assert decided.status_code == 200, decided.json()
    run = stopped(run, {Run.Status.COMPENSATED, Run.Status.NEEDS_ATTENTION})
    assert run.status == Run.Status.COMPENSATED, run.status_reason
    assert SandboxEmail.objects.filter(kind="correction").count() == sent

    # a compensated run cannot be compensated again, and the refusal changes nothing
    before = _state()
    again = reviewer("post", f"/runs/{run.id}/compensate", {})
    assert_error(again, 409, "conflict", f"run {run.id} is compensated; only a run that needs attention")
    assert _state() == before


# --- approvals ---------------------------------------------------------------------------------------


def test_a_bundle_of_proposals_is_listed_and_approved_once_through_the_api(demo_tx, worker, viewer, reviewer):
    run = stopped(
        run_start(workflow="incident-fanout", input={"propose_tools": ["email.send"]}),
        {Run.Status.WAITING_FOR_APPROVAL, Run.Status.COMPLETED, Run.Status.NEEDS_ATTENTION},
    )
    assert run.status == Run.Status.WAITING_FOR_APPROVAL, run.status_reason

    listed = viewer("get", "/approvals")  # pending ones by default
    assert listed.status_code == 200
    [bundle] = [a for a in listed.json() if a["run"] == run.id]
    proposals = ToolOperation.objects.filter(run=run, tool="email.send")
    assert (bundle["kind"], bundle["status"], bundle["task"], bundle["decided_by"]) == ("bundle", "pending", None, None)
    assert bundle["operations"] == sorted(proposals.values_list("id", flat=True)) and len(bundle["operations"]) == 5
    assert "5 proposed operations" in bundle["summary"] and "email.send" in bundle["summary"]
    assert viewer("get", "/approvals", run=run.id).json() == [bundle]
    assert viewer("get", "/approvals", status="approved").json() == []
    assert not SandboxEmail.objects.exists()

    # a decision nobody can parse changes nothing
    before = _state()
    maybe = reviewer("post", f"/approvals/{bundle['id']}/decision", {"decision": "maybe"})
    assert_error(maybe, 422, "invalid_input", field="decision")
    assert _state() == before

    decided = reviewer("post", f"/approvals/{bundle['id']}/decision", {"decision": "approve", "note": "send them"})
    assert decided.status_code == 200, decided.json()
    assert (decided.json()["status"], decided.json()["decided_by"]) == ("approved", "rita")
    run = finished(run)
    assert run.status == Run.Status.COMPLETED, run.status_reason
    emails = SandboxEmail.objects.filter(idempotency_key__startswith=f"warden:{run.id}:")
    assert emails.count() == 5 == SandboxEmail.objects.count()
    assert len(set(emails.values_list("idempotency_key", flat=True))) == 5
    assert set(proposals.values_list("status", flat=True)) == {OS.COMMITTED}

    before = _state()
    again = reviewer("post", f"/approvals/{bundle['id']}/decision", {"decision": "reject"})
    assert_error(again, 409, "conflict", f"approval request {bundle['id']} is approved; it cannot be decided again")
    assert _state() == before and SandboxEmail.objects.count() == 5
    assert viewer("get", "/approvals", status="approved").json()[0]["id"] == bundle["id"]


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

    prefix = f"warden:{first.id}:"
    mine = viewer("get", "/sandbox/effects", key_prefix=prefix).json()["effects"]
    assert len(mine) == 15 and all(r["idempotency_key"].startswith(prefix) for r in mine)
    assert sorted(r["kind"] for r in mine) == sorted(["tickets.create", "crm.update", "email.send"] * 5)
    emails = viewer("get", "/sandbox/effects", key_prefix=prefix, system="email").json()["effects"]
    assert [r["kind"] for r in emails] == ["email.send"] * 5

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
