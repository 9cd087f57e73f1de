"""What-if replays (replay/, tools/replaying.py): finished incident-fanout runs run again on a candidate
incident-worker. Effects are counted in the sandbox systems, from outside the engine."""

import copy
import json
import uuid
from unittest import mock

import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents.demo import WORKER_TURNS
from agents.models import Agent, AgentVersion, Workflow, WorkflowVersion
from core.errors import Conflict, InvalidInput, LeaseLost
from evals.models import EvalCase, EvalResult, EvalSuite
from evals.suites import eval_start
from examples.refunds.payments_service import PaymentsService
from examples.refunds.setup_refunds import refunds_setup
from integrations.models import WebhookDelivery, WebhookEndpoint
from policy.models import ApprovalRequest
from replay.actors import grade_replay_pair
from replay.models import Replay, ReplayRun
from replay.services import replay_diff, replay_fails, replay_settled, replay_start
from runs.models import Run, Span, Task
from runs.services import run_fork, run_start
from tenancy.access import default_project, membership_grant
from tenancy.models import AuditEvent, Project
from tenancy.tokens import api_token_create
from tests.conftest import decide, wait_for
from tools.broker import tool_call
from tools.models import HttpTool, SandboxCall, SandboxRecord, ToolOperation

WORKER_THREADS = 8  # the fan-out's five workers at once


def finished(run) -> Run:
    wait_for(lambda: Run.objects.get(id=run.id).status in Run.TERMINAL, timeout=60, message=f"run {run.id} to end")
    run.refresh_from_db()
    return run


def effects() -> int:
    return SandboxCall.objects.filter(is_effect=True).count()


def settled(replay) -> dict:
    wait_for(lambda: replay_settled(replay), timeout=60, message=f"replay {replay.id} to settle")
    return replay_diff(replay)


def current_version(slug: str) -> int:
    return AgentVersion.objects.filter(agent__slug=slug, draft=False).order_by("-number").first().number


def follow_up_script() -> list:
    """The worker's script, with a second CRM update and a follow-up e-mail (irreversible) before its answer."""
    turns = copy.deepcopy(WORKER_TURNS)
    extra = [
        {"say": "Noting the follow-up.", "tool": "crm.update",
         "arguments": {"customer_id": "cust-{task}", "fields": {"followed_up": "yes"}}},
        {"say": "And a follow-up.", "tool": "email.send",
         "arguments": {"to": "{task}@customers.example", "subject": "Follow-up", "body": "Any news?"}},
    ]  # fmt: skip
    return [*turns[:-1], *extra, turns[-1]]


@pytest.fixture
def originals(demo_tx, worker):
    runs = [finished(run_start(workflow="incident-fanout")) for _ in range(2)]
    assert all(r.status == Run.Status.COMPLETED for r in runs), [r.status_reason for r in runs]
    return runs


def test_an_unchanged_agent_replays_with_no_difference_and_no_effect(originals):
    before = effects()
    replay = replay_start(
        run_ids=[r.id for r in originals], agent="incident-worker", version=current_version("incident-worker"),
        via="test",
    )  # fmt: skip
    diff = settled(replay)
    assert effects() == before
    assert diff["total"]["runs"] == 2 and diff["total"]["differing"] == 0, diff
    for pair in diff["runs"]:
        assert pair["difference"] is False and pair["output_equal"] and pair["first_divergence"] is None, pair
        assert pair["calls_added"] == [] and pair["calls_removed"] == []
    replayed = [p["replay"] for p in diff["runs"]]
    # Every call was answered from the original's ledger, and the replay wrote no ledger row of its own.
    assert ToolOperation.objects.filter(run_id__in=replayed).count() == 0
    assert Run.objects.filter(id__in=replayed, mode=Run.Mode.REPLAY).count() == 2


def test_a_draft_that_sends_a_follow_up_reports_it_with_its_verdict_and_sends_nothing(originals):
    before = effects()
    replay = replay_start(
        run_ids=[r.id for r in originals], agent="incident-worker", edits={"script": follow_up_script()}, via="test"
    )
    diff = settled(replay)
    assert effects() == before
    assert diff["total"]["differing"] == 2 and diff["total"]["irreversible_added"] == 2 * 5, diff["total"]
    for pair in diff["runs"]:
        added = [(c["tool"], c["reversibility"], c["answered"]) for c in pair["calls_added"]]
        # Irreversible first: each of the five workers' follow-up e-mail, then their CRM notes.
        irreversible, reversible = ("email.send", "irreversible", "not_sent"), ("crm.update", "reversible", "not_sent")
        assert added == [irreversible] * 5 + [reversible] * 5
        assert all(c["verdict"] in ("allow", "approval") for c in pair["calls_added"])
        assert pair["calls_removed"] == [] and pair["first_divergence"]["task"].startswith("worker-")
    # The draft is the candidate; the agent as it is keeps being what new runs start on.
    draft = AgentVersion.objects.get(id=replay.candidate_version_id)
    assert draft.draft and draft.config["script"] == follow_up_script()
    assert Agent.objects.get(slug="incident-worker").script == WORKER_TURNS
    live = finished(run_start(workflow="incident-fanout"))
    assert not Task.objects.filter(run=live, agent_version_id=draft.id).exists()


def test_the_differences_of_any_number_of_runs_are_read_in_4_queries(originals):
    """The pairs, the originals' ledger, every run's journal and every run's outputs: one query each, whether
    the replay has one run or many (a replay may have 500)."""
    one = replay_start(run_ids=[originals[0].id], agent="incident-worker", edits={"script": follow_up_script()})
    both = replay_start(
        run_ids=[r.id for r in originals], agent="incident-worker", edits={"script": follow_up_script()}
    )
    for replay in (one, both):
        settled(replay)
        with CaptureQueriesContext(connection) as queries:
            diff = replay_diff(replay)
        assert len(queries) == 4, [q["sql"][:120] for q in queries]
        assert diff["total"]["irreversible_added"] == 5 * len(diff["runs"])


def test_live_reads_send_only_the_reads_safe_to_repeat_and_nothing_else(originals):
    """Every worker reads a customer its original did not (crm.read: safe to repeat) and searches (not
    declared so): with live reads, the record reads are sent, and only those."""
    SandboxRecord.objects.create(customer_id="cust-elsewhere", name="Elsewhere Ltd", fields={"status": "active"})
    script = [
        {"say": "Reading another customer.", "tool": "crm.read", "arguments": {"customer_id": "cust-elsewhere"}},
        {"say": "Searching.", "tool": "search.query", "arguments": {"query": "incident"}},
        {"final": {"summary": "{task}: read"}},
    ]
    edits = {"script": script, "allowed_tools": ["crm.read", "search.query", "tickets.create"]}
    reads = SandboxCall.objects.filter(is_effect=False)
    for live in (False, True):
        before, read_before = effects(), reads.count()
        replay = replay_start(run_ids=[originals[0].id], agent="incident-worker", edits=edits, live_reads=live)
        (pair,) = settled(replay)["runs"]
        replayed = Run.objects.get(id=pair["replay"])
        answers = sorted((c["tool"], c["task"], c["answered"]) for c in answered_calls(replayed))
        expected = sorted(
            [("crm.read", f"worker-{n}", "live" if live else "not_recorded") for n in range(1, 6)]
            + [("search.query", f"worker-{n}", "not_recorded") for n in range(1, 6)]
        )
        assert answers == expected, answers
        # Five live record reads reached the CRM (counted there), and nothing else did: no search, no effect.
        ours = reads.filter(idempotency_key__startswith=f"replay-{replayed.id}-")
        assert list(ours.values_list("tool", flat=True)) == ["crm.read"] * (5 if live else 0)
        assert reads.count() - read_before == ours.count() and effects() == before
        assert ToolOperation.objects.filter(run=replayed).count() == 0
        assert replayed.live_reads is live
    # A live read leaves only while its attempt holds the lease: one whose lease was taken sends nothing.
    worker = Task.objects.get(run=replayed, key="worker-2")
    before = reads.count()
    with pytest.raises(LeaseLost):
        tool_call(run=replayed, task=worker, step=99, call_number=9, name="crm.read",
                  arguments={"customer_id": "cust-elsewhere"}, fence=(worker.id, worker.fencing_token + 1))  # fmt: skip
    assert reads.count() == before


def answered_calls(run) -> list[dict]:
    rows = Span.objects.filter(run=run, kind=Span.Kind.TOOL_CALL, step__isnull=False).select_related("task")
    return [{**(s.body or {}).get("replay", {}), "task": s.task.key} for s in rows]


def test_a_suites_runs_replayed_are_graded_by_its_cases_and_a_lost_check_fails_ci(demo_tx, worker, tmp_path):
    """An evaluation suite's case says the customer is e-mailed; a draft that drops the e-mail adds no call,
    so only the graded check tells: it regressed, and --fail-on irreversible-added exits 1 for it."""
    suite = EvalSuite.objects.create(slug="fanout", name="Fan-out", project=default_project())
    fanout = Workflow.objects.get(slug="incident-fanout")
    # A judge too: a model (scripted here) grades worker-1's summary, on the original and on each replay.
    Agent.objects.create(slug="fanout-judge", name="Judge", script=[{"final": {"score": 0.9, "reasoning": "fine"}}])
    judge = {"agent": "fanout-judge", "artifact": "worker-1", "rubric": "Is the customer looked after?"}
    checks = [{"status": "completed"}, {"tool_called": "email.send"}, {"judge": judge}]
    EvalCase.objects.create(suite=suite, name="e-mails the customer", workflow=fanout, checks=checks)
    with pytest.raises(InvalidInput, match="no settled run"):
        replay_start(suite=suite, agent="incident-worker", version=current_version("incident-worker"))
    (result,) = eval_start(suite=suite, via="test").results.all()
    finished(result.run)
    wait_for(lambda: EvalResult.objects.get(id=result.id).passed is not None, timeout=30, message="the judge")
    quiet = [*WORKER_TURNS[:3], {"final": {"summary": "{task}: ticket opened, nobody told"}}]
    before = effects()
    unchanged = settled(replay_start(suite=suite, agent="incident-worker", version=current_version("incident-worker")))
    (pair,) = unchanged["runs"]
    assert pair["original"] == result.run_id and pair["checks"]["regressed"] is False, pair["checks"]
    graded = pair["checks"]["judges"]
    assert [(g["score"], g["passed"]) for g in graded["original"] + graded["replay"]] == [(0.9, True)] * 2
    assert not replay_fails(unchanged, "irreversible-added")
    # The judges' message fed twice: the second finds the pair graded and asks no model.
    graded_pair = ReplayRun.objects.get(run_id=pair["replay"])
    with mock.patch("replay.services.grade", side_effect=AssertionError("the judge was asked again")):
        grade_replay_pair.fn(pair_id=graded_pair.id)
    assert ReplayRun.objects.get(id=graded_pair.id).grades == graded_pair.grades
    dropped = settled(replay_start(suite=suite, agent="incident-worker", edits={"script": quiet}))
    (pair,) = dropped["runs"]
    checks = {k: v for k, v in pair["checks"].items() if k != "judges"}
    assert checks == {"case": "e-mails the customer", "original": [], "replay": [
        "email.send would not have been called"], "regressed": True, "fixed": False}  # fmt: skip
    assert dropped["total"]["checks_regressed"] == 1 and dropped["total"]["irreversible_added"] == 0
    assert replay_fails(dropped, "irreversible-added") and replay_fails(dropped, "check-regressed")
    edits = tmp_path / "quiet.json"
    edits.write_text(json.dumps({"script": quiet}))
    with pytest.raises(CommandError) as failed:
        call_command("replay", suite="fanout", agent="incident-worker", edits=str(edits), fail_on="irreversible-added")
    assert failed.value.returncode == 1
    assert effects() == before


def test_a_workflow_version_is_a_candidate_too_and_replaying_one_makes_no_version(originals, operator, client):
    """The workflow is changed after the runs: every CRM update now waits for a reviewer. Replayed on that
    version (the agents as they are), the same calls are made, and each would have waited; replayed on
    the version the runs had, none would. No version of the workflow is made by a replay."""
    fanout = Workflow.objects.get(slug="incident-fanout")
    then = WorkflowVersion.objects.filter(workflow=fanout).order_by("-number").first()
    fanout.tool_policies = {"crm.update": {"approval": "always"}}
    fanout.save()
    now = WorkflowVersion.objects.filter(workflow=fanout).order_by("-number").first()
    assert now.number == then.number + 1
    made = WorkflowVersion.objects.count()
    strict = settled(replay_start(run_ids=[r.id for r in originals], workflow_version=now.number, via="test"))
    assert strict["total"]["differing"] == 0 and strict["total"]["would_wait_for_approval"] == 2 * 5, strict["total"]
    assert {c["tool"] for p in strict["runs"] for c in p["would_wait_for_approval"]} == {"crm.update"}
    assert {Run.objects.get(id=p["replay"]).workflow_version_id for p in strict["runs"]} == {now.id}
    lenient = settled(replay_start(run_ids=[r.id for r in originals], workflow_version=then.number))
    assert lenient["total"]["would_wait_for_approval"] == 0
    assert {Run.objects.get(id=p["replay"]).workflow_version_id for p in lenient["runs"]} == {then.id}
    assert WorkflowVersion.objects.count() == made
    client.force_login(operator)
    page = client.get(f"/replays/{strict['replay']}/").content.decode()
    assert f"the workflow's v{now.number}" in page and "None" not in page.split('id="replay-candidate"')[1][:200]
    with pytest.raises(InvalidInput, match="has no version 99"):
        replay_start(run_ids=[originals[0].id], workflow_version=99)
    with pytest.raises(InvalidInput, match="name an agent's candidate"):
        replay_start(run_ids=[originals[0].id])


def test_the_command_exits_1_when_the_candidate_adds_an_irreversible_call(originals, tmp_path, capsys):
    edits = tmp_path / "draft.json"
    edits.write_text(json.dumps({"script": follow_up_script()}))
    runs = ",".join(str(r.id) for r in originals)
    before = effects()
    with pytest.raises(CommandError) as failed:
        call_command("replay", runs=runs, agent="incident-worker", edits=str(edits), fail_on="irreversible-added")
    assert failed.value.returncode == 1
    out = capsys.readouterr().out
    assert "DIFFERS" in out and "+ email.send (irreversible" in out
    # The same candidate as its version passes a line it does not cross; an unchanged one passes all.
    call_command("replay", runs=runs, agent="incident-worker", agent_version=current_version("incident-worker"),
                 fail_on="any-difference")  # fmt: skip
    assert effects() == before


def test_a_candidate_told_to_call_every_write_it_has_reaches_no_system_and_no_reviewer(originals):
    """The hostile candidate: every write tool of the worker, with arguments no original used."""
    writes = [
        ("tickets.create", {"customer_id": "cust-x", "title": "Hostile"}),
        ("crm.update", {"customer_id": "cust-x", "fields": {"owned": "yes"}}),
        ("email.send", {"to": "everyone@customers.example", "subject": "Hi", "body": "Hostile"}),
    ]
    script = [{"say": "go", "tool": tool, "arguments": args} for tool, args in writes]
    script.append({"final": {"summary": "done"}})
    WebhookEndpoint.objects.create(url="http://127.0.0.1:9/hook", secret="s" * 32, active=True)
    before, deliveries = effects(), WebhookDelivery.objects.count()
    replay = replay_start(run_ids=[originals[0].id], agent="incident-worker", edits={"script": script}, via="test")
    diff = settled(replay)
    (pair,) = diff["runs"]
    assert effects() == before
    assert {c["tool"] for c in pair["calls_added"]} == {tool for tool, _ in writes}
    assert ToolOperation.objects.filter(run_id=pair["replay"]).count() == 0
    assert not ApprovalRequest.objects.filter(run_id=pair["replay"]).exists()  # nothing to approve into an effect
    assert WebhookDelivery.objects.count() == deliveries  # a replay's end is told to nobody outside
    # Nor can it be forked into a live run, which would take its stand-in answers for effects made.
    runs = Run.objects.count()
    with pytest.raises(Conflict, match="is a replay"):
        run_fork(run_id=pair["replay"], task_key="worker-1", step=2)
    assert Run.objects.count() == runs


@pytest.mark.parametrize(
    "change, message",
    [
        ({"edits": {"project": 7}}, "a draft may change only"),
        ({"edits": {"script": "not a list"}}, "script must be a list"),
        ({"version": 999}, "has no version 999"),
        ({"agent": "inventory-agent", "version": 1}, "does not use inventory-agent"),
        ({}, "name a version of the agent, or the edits of a draft"),
    ],
)
def test_a_bad_replay_is_refused_clearly_and_changes_nothing(originals, change, message):
    runs, replays = Run.objects.count(), Replay.objects.count()
    kwargs = {"run_ids": [originals[0].id], "agent": "incident-worker", **change}
    with pytest.raises(InvalidInput, match=message):
        replay_start(**kwargs, via="test")
    assert (Run.objects.count(), Replay.objects.count()) == (runs, replays)
    assert not AgentVersion.objects.filter(draft=True).exists()


def _bearer(user) -> dict:
    scopes = ["read", "run", "operate", "admin"]  # what each may do is the role's: the token asks for all
    return {"HTTP_AUTHORIZATION": f"Bearer {api_token_create(user=user, scopes=scopes)[1]}"}


def api_people(django_user_model, prefix: str) -> tuple[dict, object]:
    """An operator, an admin and a viewer of the default project, and an admin of another project only."""
    people = {}
    for role in ("operator", "admin", "viewer"):
        people[role] = django_user_model.objects.create_user(username=f"{prefix}-{role}", password="pass-12345678")
        membership_grant(user=people[role], project=default_project(), role=role)
    outsider = django_user_model.objects.create_user(username=f"{prefix}-out", password="pass-12345678")
    membership_grant(user=outsider, project=Project.objects.create(slug="elsewhere", name="Elsewhere"), role="admin")
    return people, outsider


def test_the_api_replays_for_an_operator_keeps_drafts_to_admins_and_hides_other_projects(
    originals, django_user_model, client
):
    people, outsider = api_people(django_user_model, "r")
    ids = [r.id for r in originals]
    version = current_version("incident-worker")

    def post(user, body):
        return client.post("/api/v1/replays", data=json.dumps(body), content_type="application/json", **_bearer(user))

    before, replays = effects(), Replay.objects.count()
    assert post(outsider, {"runs": ids, "agent": "incident-worker", "version": version}).status_code == 404
    assert post(people["viewer"], {"runs": ids, "agent": "incident-worker", "version": version}).status_code == 403
    draft = {"runs": ids, "agent": "incident-worker", "edits": {"script": follow_up_script()}}
    assert post(people["operator"], draft).status_code == 403  # a draft is the agent's configuration
    assert Replay.objects.count() == replays
    made = post(people["operator"], {"runs": ids, "agent": "incident-worker", "version": version})
    assert made.status_code == 201, made.content
    replay_id = made.json()["id"]
    created = post(people["admin"], draft)
    assert created.status_code == 201, created.content
    settled(Replay.objects.get(id=created.json()["id"]))
    got = client.get(f"/api/v1/replays/{created.json()['id']}", **_bearer(people["viewer"])).json()
    assert got["settled"] and got["total"]["irreversible_added"] == 10 and got["candidate"]["draft"] is True
    assert client.get(f"/api/v1/replays/{replay_id}", **_bearer(outsider)).status_code == 404
    assert effects() == before
    audited = AuditEvent.objects.filter(action="replay_start").values_list("actor__username", "outcome")
    assert sorted(audited) == [("r-admin", "done"), ("r-operator", "done")]


def test_a_hostile_candidate_reaches_no_http_or_mcp_system_either(demo_tx, worker, django_user_model, monkeypatch,
                                                                  tmp_path, settings):  # fmt: skip
    """The refunds example (an HTTP payments service, a ticketing MCP server over stdio): a refund made once
    after a reviewer's yes; then a candidate that refunds again, more, with new tickets and comments. The
    systems count every request they get."""
    key = f"demo-{uuid.uuid4().hex}"
    monkeypatch.setenv("PAYMENTS_API_KEY", key)
    settings.WARDEN = {**settings.WARDEN, "SECRET_GRANTS": {"PAYMENTS_API_KEY": ["default"]}}
    tickets, calls = tmp_path / "tickets.jsonl", tmp_path / "calls.jsonl"
    monkeypatch.setenv("TICKETS_EFFECTS", str(tickets))
    monkeypatch.setenv("TICKETS_CALLS", str(calls))  # every call the MCP server gets
    payments = PaymentsService(api_key=key).start()
    try:
        refunds_setup(payments_url=payments.url, mcp_command="tickets")
        reviewer = django_user_model.objects.create_user(username="rita", password="x-pass-123456")
        membership_grant(user=reviewer, project=default_project(), role="reviewer")
        original = run_start(workflow="refund-request", input={"charge_id": "ch_1001", "why": "arrived broken"})
        wait_for(lambda: ApprovalRequest.objects.filter(run=original).exists(), timeout=60, message="the request")
        decide(request_id=ApprovalRequest.objects.get(run=original).id, user=reviewer, approve=True)
        assert finished(original).status == Run.Status.COMPLETED
        requests, ticket_lines, call_lines = len(payments.requests), tickets.read_text(), calls.read_text()
        # The refund's declaration gives an example answer: the replay's model is told it, and nothing goes.
        example = {"id": "re_example", "status": "pending", "amount_cents": 0}
        HttpTool.objects.filter(name="payments.refund").update(example_answer=example)
        hostile = [
            {"tool": "payments.refund", "arguments": {"charge_id": "ch_1001", "amount_cents": 9999, "reason": "more"}},
            {"tool": "helpdesk.create_ticket", "arguments": {"title": "Hostile", "body": "again"}},
            {"tool": "helpdesk.add_comment", "arguments": {"ticket_id": "T-1", "text": "again"}},
            {"final": {"refund": "{last}"}},
        ]
        replay = replay_start(run_ids=[original.id], agent="refund-agent", edits={"script": hostile}, via="test")
        (pair,) = settled(replay)["runs"]
        assert len(payments.requests) == requests and len(payments.effects) == 1  # the original's refund only
        assert (tickets.read_text(), calls.read_text()) == (ticket_lines, call_lines)
        assert {c["tool"] for c in pair["calls_added"]} >= {"payments.refund", "helpdesk.create_ticket"}
        refund = next(c for c in pair["calls_added"] if c["tool"] == "payments.refund")
        assert refund["verdict"] == "approval" and refund["answered"] == "not_sent"  # it would have waited
        told = Span.objects.get(run_id=pair["replay"], kind=Span.Kind.TOOL_CALL, name="payments.refund").body
        assert told["result"] == example and "error" not in told, told
        assert not ApprovalRequest.objects.filter(run_id=pair["replay"]).exists()
        assert ToolOperation.objects.filter(run_id=pair["replay"]).count() == 0
    finally:
        payments.stop()


def test_a_replay_is_marked_on_its_page_and_in_the_runs_list(originals, operator, client):
    """At 3 a.m. nobody should take a replay's 'completed' for work done in the world."""
    original = originals[0]
    replay = replay_start(
        run_ids=[original.id], agent="incident-worker", version=current_version("incident-worker"), via="test"
    )
    settled(replay)
    run_id = replay.pairs.get().run_id
    client.force_login(operator)
    page = client.get(f"/runs/{run_id}/").content.decode()
    assert "A what-if replay of" in page and f'href="/runs/{original.id}/"' in page
    assert "A what-if replay of" not in client.get(f"/runs/{original.id}/").content.decode()
    rows = client.get("/runs/").content.decode()
    assert rows.count('class="badge replay"') == 1 and f'id="run-row-{run_id}"' in rows


def test_a_projects_draft_of_a_shared_agent_stays_out_of_other_projects_sight(originals, django_user_model, client):
    """incident-worker is shared by every project: the admin shows its versions to any member. A draft is
    the replaying project's, and is not among them."""
    marker = f"draft-{uuid.uuid4().hex}"
    replay_start(run_ids=[originals[0].id], agent="incident-worker", edits={"instructions": marker}, via="test")
    outsider = django_user_model.objects.create_user(username="r-out2", password="pass-12345678", is_staff=True)
    membership_grant(user=outsider, project=Project.objects.create(slug="elsewhere", name="Elsewhere"), role="admin")
    # Every Django permission on versions and agents (as the admin matrix gives staff): the scoping must hold.
    outsider.user_permissions.set(Permission.objects.filter(content_type__app_label="agents"))
    client.force_login(outsider)
    agent = Agent.objects.get(slug="incident-worker")
    for url in (f"/admin/agents/agent/{agent.id}/change/", "/admin/agents/agentversion/"):
        response = client.get(url)
        assert response.status_code == 200 and marker not in response.content.decode(), url
