"""Shadows (replay/shadows.py): a candidate incident-worker follows incident-fanout's live runs. Effects are
counted in the sandbox systems, from outside the engine; a twin must never hold its production run."""

import json
import time
import uuid

import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command

from agents.models import Workflow
from core.errors import InvalidInput
from examples.refunds.payments_service import PaymentsService
from examples.refunds.setup_refunds import refunds_setup
from integrations.models import WebhookDelivery, WebhookEndpoint
from policy.models import ApprovalRequest
from replay.actors import shadow_start
from replay.models import Shadow
from replay.services import replay_diff
from replay.shadows import START_WITHIN_SECONDS, shadow_off, shadow_on
from runs.models import Run, Span, Task
from runs.services import run_cancel, run_start
from runs.services.execution import task_execute
from tenancy.access import default_project, membership_grant
from tenancy.models import AuditEvent
from tests.conftest import decide, wait_for
from tests.replay.test_replay import _bearer, api_people, current_version, effects, finished, follow_up_script
from tools.models import ToolOperation

WORKER_THREADS = 8  # a run's five workers and its twin's at once


def twin_of(run) -> Run:
    found = wait_for(lambda: Run.objects.filter(replay_of=run, mode=Run.Mode.SHADOW).first(), timeout=30,
                     message=f"run {run.id}'s twin")  # fmt: skip
    return found


def both_settled(shadow, count: int) -> dict:
    def ready():
        diff = replay_diff(shadow.replay)
        return diff if diff["total"]["runs"] == count and diff["total"]["settled"] == count else None

    return wait_for(ready, timeout=60, message=f"shadow {shadow.id}'s {count} pairs to settle")


def answered(run) -> list[str]:
    """How each of the run's tool calls was answered, from its journal."""
    rows = Span.objects.filter(run=run, kind=Span.Kind.TOOL_CALL, step__isnull=False).values_list("body", flat=True)
    return [(body or {}).get("replay", {}).get("answered") for body in rows]


def reviewer(django_user_model):
    user = django_user_model.objects.create_user(username=f"rita-{uuid.uuid4().hex[:6]}", password="x-pass-123456")
    membership_grant(user=user, project=default_project(), role="reviewer")
    return user


def test_a_shadow_follows_live_runs_sends_nothing_and_its_differences_appear_when_both_finish(
    demo_tx, worker, operator, client
):
    before = effects()
    plain = finished(run_start(workflow="incident-fanout"))
    per_run = effects() - before
    assert per_run > 0 and not Run.objects.filter(replay_of=plain).exists()  # nothing shadows it yet

    shadow = shadow_on(project=default_project(), workflow="incident-fanout", agent="incident-worker",
                       edits={"script": follow_up_script()}, via="test")  # fmt: skip
    before = effects()
    runs = [run_start(workflow="incident-fanout") for _ in range(2)]
    twins = [twin_of(run) for run in runs]
    runs = [finished(run) for run in runs]
    assert all(run.status == Run.Status.COMPLETED for run in runs)
    diff = both_settled(shadow, 2)
    # The production runs' own effects, and not one more.
    assert effects() - before == 2 * per_run
    assert ToolOperation.objects.filter(run__in=twins).count() == 0
    assert diff["total"]["differing"] == 2 and diff["total"]["irreversible_added"] == 2 * 5, diff["total"]
    pairs = {pair["original"]: pair for pair in diff["runs"]}
    for run, twin in zip(runs, twins, strict=True):
        pair = pairs[run.id]
        assert pair["replay"] == twin.id
        assert [c["tool"] for c in pair["irreversible_added"]] == ["email.send"] * 5
        assert pair["calls_removed"] == []
        # Every call the production run made was answered from its ledger, as it was written.
        committed = ToolOperation.objects.filter(run=run, kind="action", status="committed").count()
        assert answered(twin).count("recorded") == committed
        assert answered(twin).count("not_sent") == 10  # the follow-up's CRM note and e-mail, per worker
    # The twin says what it is on its page and in the runs list; the production run's page says nothing.
    client.force_login(operator)
    page = client.get(f"/runs/{twins[0].id}/").content.decode()
    assert "A shadow of" in page and f'href="/runs/{runs[0].id}/"' in page
    assert "A shadow of" not in client.get(f"/runs/{runs[0].id}/").content.decode()
    assert client.get("/runs/").content.decode().count('title="A shadow of a live run') == 2


def test_a_shadow_never_holds_its_run_and_switched_off_it_stops_at_once(demo_tx, worker, django_user_model):
    """The production run waits for a reviewer before its e-mails; its twin waits for the production run's
    ledger. The reviewer decides on the production run alone; switching the shadow off cancels the twin
    still going, and the next run starts none."""
    rita = reviewer(django_user_model)
    version = current_version("incident-worker")
    shadow = shadow_on(project=default_project(), workflow="incident-fanout", agent="incident-worker",
                       version=version, via="test")  # fmt: skip
    assert Workflow.objects.get(slug="incident-fanout").shadowed_in == [default_project().id]
    run = run_start(workflow="incident-fanout", input={"propose_tools": ["email.send"]})
    twin = twin_of(run)
    wait_for(lambda: Run.objects.get(id=run.id).status == Run.Status.WAITING_FOR_APPROVAL, timeout=60,
             message="the production run to wait for its reviewer")  # fmt: skip
    # The twin asks for no decision: there is one request, the production run's.
    assert set(ApprovalRequest.objects.values_list("run_id", flat=True)) == {run.id}
    decide(request_id=ApprovalRequest.objects.get(run=run, parent=None).id, user=rita, approve=True)
    assert finished(run).status == Run.Status.COMPLETED
    (pair,) = both_settled(shadow, 1)["runs"]
    # The e-mails it waited for were answered by their receipts once sent. (Its workers' summaries say
    # "sent" where the production run's say "proposed": what the proposal was told then, not what happened.)
    assert (pair["calls_added"], pair["calls_removed"], pair["status"]["replay"]) == ([], [], "completed"), pair
    assert answered(twin).count("recorded") == len(answered(twin))

    # A second run's twin is going when the shadow is switched off: it is cancelled; the run goes on.
    second = run_start(workflow="incident-fanout", input={"propose_tools": ["email.send"]})
    second_twin = twin_of(second)
    wait_for(lambda: Run.objects.get(id=second.id).status == Run.Status.WAITING_FOR_APPROVAL, timeout=60,
             message="the second run to wait for its reviewer")  # fmt: skip
    shadow_off(shadow=shadow, via="test")
    wait_for(lambda: Run.objects.get(id=second_twin.id).status == Run.Status.CANCELLED, timeout=30,
             message="the twin to stop")  # fmt: skip
    assert Run.objects.get(id=second.id).status == Run.Status.WAITING_FOR_APPROVAL
    decide(request_id=ApprovalRequest.objects.get(run=second, parent=None).id, user=rita, approve=True)
    assert finished(second).status == Run.Status.COMPLETED
    third = finished(run_start(workflow="incident-fanout"))
    assert not Run.objects.filter(replay_of=third).exists()
    assert Workflow.objects.get(slug="incident-fanout").shadowed_in == []
    assert list(
        AuditEvent.objects.filter(action__startswith="shadow_").order_by("id").values_list("action", "outcome")
    ) == [
        ("shadow_on", "done"),
        ("shadow_off", "done"),
    ]


def test_a_hostile_shadow_of_kit_tools_reaches_no_system_reviewer_or_webhook(demo_tx, worker):
    writes = [
        ("tickets.create", {"customer_id": "cust-x", "title": "Hostile"}),
        ("crm.update", {"customer_id": "cust-x", "fields": {"owned": "yes"}}),
        ("email.send", {"to": "everyone@customers.example", "subject": "Hi", "body": "Hostile"}),
    ]
    script = [{"say": "go", "tool": tool, "arguments": args} for tool, args in writes]
    script.append({"final": {"summary": "done"}})
    before = effects()
    plain = finished(run_start(workflow="incident-fanout"))
    per_run = effects() - before
    WebhookEndpoint.objects.create(url="http://127.0.0.1:9/hook", secret="s" * 32, active=True)
    shadow = shadow_on(project=default_project(), workflow="incident-fanout", agent="incident-worker",
                       edits={"script": script}, via="test")  # fmt: skip
    before, deliveries = effects(), WebhookDelivery.objects.count()
    run = finished(run_start(workflow="incident-fanout"))
    (pair,) = both_settled(shadow, 1)["runs"]
    assert effects() - before == per_run and plain.status == run.status == Run.Status.COMPLETED
    assert {c["tool"] for c in pair["calls_added"]} == {tool for tool, _ in writes}
    assert ToolOperation.objects.filter(run_id=pair["replay"]).count() == 0
    assert not ApprovalRequest.objects.filter(run_id=pair["replay"]).exists()
    # The production run's end is announced; its twin's is not.
    announced = [d.payload for d in WebhookDelivery.objects.order_by("id")[deliveries:]]
    about = [p["data"].get("run") for p in announced]
    assert run.id in about and pair["replay"] not in about, announced


def test_a_hostile_shadow_reaches_no_http_or_mcp_system(demo_tx, worker, django_user_model, monkeypatch, tmp_path,
                                                       settings):  # fmt: skip
    """The refunds example (an HTTP payments service, a ticketing MCP server over stdio), its runs shadowed
    by a candidate that refunds again, more, with new tickets and comments: the systems get the production
    runs' requests only (counted by the systems themselves)."""
    key = f"demo-{uuid.uuid4().hex}"
    monkeypatch.setenv("PAYMENTS_API_KEY", key)
    settings.WARDEN = {**settings.WARDEN, "SECRET_GRANTS": {"PAYMENTS_API_KEY": ["default"]}}
    tickets, calls = tmp_path / "tickets.jsonl", tmp_path / "calls.jsonl"
    monkeypatch.setenv("TICKETS_EFFECTS", str(tickets))
    monkeypatch.setenv("TICKETS_CALLS", str(calls))
    payments = PaymentsService(api_key=key).start()
    rita = reviewer(django_user_model)

    def refund(charge: str) -> tuple[int, int, int]:
        """A refund approved by a reviewer; what it cost each system (requests, tickets, MCP calls)."""
        counts = (len(payments.requests), _lines(tickets), _lines(calls))
        run = run_start(workflow="refund-request", input={"charge_id": charge, "why": "arrived broken"})
        wait_for(lambda: ApprovalRequest.objects.filter(run=run).exists(), timeout=60, message="the request")
        decide(request_id=ApprovalRequest.objects.get(run=run).id, user=rita, approve=True)
        assert finished(run).status == Run.Status.COMPLETED
        return tuple(now - then for now, then in zip((len(payments.requests), _lines(tickets), _lines(calls)),
                                                     counts, strict=True))  # fmt: skip

    try:
        refunds_setup(payments_url=payments.url, mcp_command="tickets")
        alone = refund("ch_1001")
        hostile = [
            {"tool": "payments.refund", "arguments": {"charge_id": "ch_1002", "amount_cents": 9999, "reason": "more"}},
            {"tool": "helpdesk.create_ticket", "arguments": {"title": "Hostile", "body": "again"}},
            {"tool": "helpdesk.add_comment", "arguments": {"ticket_id": "T-1", "text": "again"}},
            {"final": {"refund": "{last}"}},
        ]
        shadow = shadow_on(project=default_project(), workflow="refund-request", agent="refund-agent",
                           edits={"script": hostile}, via="test")  # fmt: skip
        shadowed = refund("ch_1002")
        (pair,) = both_settled(shadow, 1)["runs"]
        assert shadowed == alone and len(payments.effects) == 2  # two refunds: the production runs' own
        refunded = next(c for c in pair["calls_added"] if c["tool"] == "payments.refund")
        assert refunded["verdict"] == "approval" and refunded["answered"] == "not_sent"
        assert not ApprovalRequest.objects.filter(run_id=pair["replay"]).exists()
        assert ToolOperation.objects.filter(run_id=pair["replay"]).count() == 0
    finally:
        payments.stop()


def _lines(path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.parametrize(
    "change, message",
    [
        ({"workflow": "nope"}, "unknown workflow"),
        ({"agent": "incident-supervisor-x"}, "does not use"),
        ({"version": 999}, "has no version 999"),
        ({"version": None, "edits": {"owner": "me"}}, "a draft may change only"),
    ],
)
def test_a_bad_shadow_is_refused_clearly_and_changes_nothing(demo_tx, change, message):
    body = {"workflow": "incident-fanout", "agent": "incident-worker", "version": current_version("incident-worker"),
            **change}  # fmt: skip
    with pytest.raises(InvalidInput, match=message):
        shadow_on(project=default_project(), via="test", **body)
    assert not Shadow.objects.exists() and Workflow.objects.get(slug="incident-fanout").shadowed_in == []


def test_the_shadows_api_is_an_operators_keeps_drafts_to_admins_and_hides_other_projects(
    demo_tx, django_user_model, client
):
    people, outsider = api_people(django_user_model, "s")
    version = {"workflow": "incident-fanout", "agent": "incident-worker", "version": current_version("incident-worker")}
    draft = {"workflow": "incident-fanout", "agent": "incident-worker", "edits": {"script": follow_up_script()}}

    def post(user, path, body=None):
        return client.post(f"/api/v1{path}", data=json.dumps(body or {}), content_type="application/json",
                           **_bearer(user))  # fmt: skip

    assert post(outsider, "/shadows", {**version, "project": "default"}).status_code in (403, 404)
    assert post(people["viewer"], "/shadows", version).status_code == 403
    assert post(people["operator"], "/shadows", draft).status_code == 403  # a draft is the agent's configuration
    assert not Shadow.objects.exists()
    made = post(people["operator"], "/shadows", version)
    assert made.status_code == 201, made.content
    assert made.json()["on"] is True and made.json()["workflow"] == "incident-fanout"
    assert post(people["admin"], "/shadows", draft).status_code == 409  # one at a time per workflow
    shadow_id = made.json()["id"]
    assert client.get(f"/api/v1/shadows/{shadow_id}", **_bearer(outsider)).status_code == 404
    assert client.get(f"/api/v1/shadows/{shadow_id}", **_bearer(people["viewer"])).json()["on"] is True
    assert post(people["viewer"], f"/shadows/{shadow_id}/off").status_code == 403
    assert post(outsider, f"/shadows/{shadow_id}/off").status_code == 404
    off = post(people["operator"], f"/shadows/{shadow_id}/off")
    assert off.status_code == 200 and off.json()["on"] is False
    assert post(people["operator"], f"/shadows/{shadow_id}/off").status_code == 409
    assert Workflow.objects.get(slug="incident-fanout").shadowed_in == []


def test_a_twin_starts_on_spare_time_only_and_is_counted_when_it_never_could(demo_tx):
    """No worker runs here: the live run's tasks wait for one, so its twin's start is put off; past the
    limit it is skipped and counted; once no live work is going, the twin starts."""
    shadow = shadow_on(project=default_project(), workflow="incident-fanout", agent="incident-worker",
                       version=current_version("incident-worker"), via="test")  # fmt: skip
    run = run_start(workflow="incident-fanout")
    assert shadow_start.fn(run_id=run.id) is None and not Run.objects.filter(replay_of=run).exists()
    shadow_start.fn(run_id=run.id, times=3, since=time.time() - START_WITHIN_SECONDS - 1)
    assert Shadow.objects.get(id=shadow.id).skipped == 1 and not Run.objects.filter(replay_of=run).exists()
    run_cancel(run_id=run.id, reason="nobody will run it here")
    shadow_start.fn(run_id=run.id)
    assert Run.objects.get(replay_of=run).mode == Run.Mode.SHADOW
    shadow_start.fn(run_id=run.id)  # delivered twice: still one twin
    twin = Run.objects.get(replay_of=run)
    # Each of the twin's attempts gives way to live work too: while another run's tasks wait, its first task
    # hands itself back untouched; once they are gone, it runs.
    first = Task.objects.filter(run=twin, status=Task.Status.READY).order_by("id").first()
    other = run_start(workflow="incident-fanout")
    task_execute(run_id=twin.id, task_id=first.id)
    first.refresh_from_db()
    assert (first.status, first.steps_used) == (Task.Status.READY, 0) and "spare time" in first.status_reason
    run_cancel(run_id=other.id, reason="nobody will run it here")
    task_execute(run_id=twin.id, task_id=first.id)
    first.refresh_from_db()
    # (It gets no further than its first read: the production run it follows never made one.)
    assert first.status != Task.Status.READY and first.steps_used > 0, first.status_reason


def test_the_shadow_command_switches_one_on_shows_it_and_switches_it_off(demo_tx, capsys):
    version = current_version("incident-worker")
    call_command("shadow", workflow="incident-fanout", agent="incident-worker", agent_version=version)
    shadow = Shadow.objects.get(on=True)
    assert f"shadow {shadow.id}: new runs of incident-fanout start a twin on incident-worker v{version}" in (
        capsys.readouterr().out
    )
    call_command("shadow", show=shadow.id)
    assert f"shadow {shadow.id} of incident-fanout (on): 0 twin(s)" in capsys.readouterr().out
    with pytest.raises(CommandError, match="is on in this project") as refused:
        call_command("shadow", workflow="incident-fanout", agent="incident-worker", agent_version=version)
    assert refused.value.returncode == 2
    call_command("shadow", off=shadow.id)
    assert not Shadow.objects.get(id=shadow.id).on and Workflow.objects.get(slug="incident-fanout").shadowed_in == []


def test_an_operator_switches_a_shadow_off_in_the_admin_and_a_viewer_cannot(demo_tx, django_user_model, client):
    people, outsider = api_people(django_user_model, "a")
    # The admin's door: staff, with Django's permissions on shadows; the role in the project decides.
    viewing = Permission.objects.filter(codename__in=["view_shadow", "change_shadow"])
    for user in django_user_model.objects.filter(username__startswith="a-"):
        user.is_staff = True
        user.save()
        user.user_permissions.add(*viewing)
    shadow = shadow_on(project=default_project(), workflow="incident-fanout", agent="incident-worker",
                       version=current_version("incident-worker"), via="test")  # fmt: skip
    action = {"action": "switch_off", "_selected_action": [shadow.id]}
    for who in ("viewer", "outsider"):
        client.force_login(outsider if who == "outsider" else people[who])
        client.post("/admin/replay/shadow/", action)
        assert Shadow.objects.get(id=shadow.id).on, who
    client.force_login(people["operator"])
    assert client.post("/admin/replay/shadow/", action).status_code == 302
    assert not Shadow.objects.get(id=shadow.id).on
    assert Workflow.objects.get(slug="incident-fanout").shadowed_in == []
    off = AuditEvent.objects.get(action="shadow_off")
    assert (off.actor, off.via, off.outcome) == (people["operator"], "admin", "done")
