"""Circuit breakers and rate limits across projects (issue 25, findings 4 and 5), tried again as the
attacker did: team A's admin declares, in team A's project, an HTTP tool with the name of the payments
project's own tool (payments.get_charge) and points it at a service that fails.

4. Its failures must not open the payments project's breaker, its calls must not use up the payments
   project's rate limit, and no one of another project sees payments' breakers (inbox, /metrics labels
   say the project).
5. Team A's admin cannot close payments' breaker nor resume its parked tasks; a breaker that closes by
   itself resumes the tasks it parked, and they stay in the inbox (closable) until then.
"""

import re
import time
import types
from http.server import BaseHTTPRequestHandler

import pytest
from django.test import Client

from dashboard.ops import metrics_text
from runs.heartbeat import lease_keeper
from runs.models import Run, Task
from runs.services import run_start
from tenancy.access import membership_grant
from tenancy.models import AuditEvent, Project
from tenancy.tokens import api_token_create
from tests.conftest import wait_for
from tests.local_http import answer_json, serve
from tests.runs.test_engine import scripted_workflow
from tests.runs.test_run_actions import drive
from tools.broker import tool_call
from tools.http_tools import http_tool_problems
from tools.models import HttpTool

TOOL = "payments.get_charge"
SCHEMA = {
    "type": "object",
    "properties": {"charge_id": {"type": "string", "pattern": "^ch_[0-9]+$"}},
    "required": ["charge_id"],
    "additionalProperties": False,
}


class ChargeService:
    """GET /v1/charges/<id>: the charge, or 503 while ``failing``. Counts what reached it."""

    def __init__(self, *, failing: bool = False):
        self.failing, self.calls = failing, 0
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                service.calls += 1
                code, body = (503, {"error": "down"}) if service.failing else (200, {"charge_id": self.path[-7:]})
                answer_json(self, body, code)

            def log_message(self, *args):
                pass

        self.server, self.url = serve(Handler)

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def declare(project: Project, service: ChargeService, **fields) -> HttpTool:
    row = HttpTool(
        project=project,
        name=TOOL,
        description="Read a card charge",
        method="GET",
        url=service.url + "/v1/charges/{charge_id}",
        arguments_schema=SCHEMA,
        tool_class="read_only",
        **fields,
    )
    assert http_tool_problems(row) == []
    row.save()
    return row


@pytest.fixture
def world(django_user_model, settings):
    """Two projects, each with its own payments.get_charge: team A's fails, payments' answers."""
    settings.WARDEN = {**settings.WARDEN, "TOOL_CIRCUIT_FAILURES": 2, "TOOL_CIRCUIT_OPEN_SECONDS": 300}
    users = django_user_model.objects
    team_a = Project.objects.create(slug="team-a", name="Team A")
    payments = Project.objects.create(slug="payments", name="Payments")
    mallory = users.create_user(username="mallory", password="mallory-pass-123")  # team A's admin
    pat = users.create_user(username="pat", password="pat-pass-123")  # payments' admin
    olga = users.create_user(username="olga", password="olga-pass-123")  # payments' operator
    membership_grant(user=mallory, project=team_a, role="admin")
    membership_grant(user=pat, project=payments, role="admin")
    membership_grant(user=olga, project=payments, role="operator")
    broken, healthy = ChargeService(failing=True), ChargeService()
    declare(team_a, broken)
    declare(payments, healthy)
    wf = scripted_workflow(
        "charge-check",
        [{"tool": TOOL, "arguments": {"charge_id": "ch_1001"}}, {"final": {"answer": "{last}"}}],
        tools=[TOOL],
        max_attempts=1,
    )
    yield types.SimpleNamespace(team_a=team_a, payments=payments, mallory=mallory, pat=pat, olga=olga,
                                broken=broken, healthy=healthy, workflow=wf.slug)  # fmt: skip
    broken.stop()
    healthy.stop()


@pytest.fixture
def driven(monkeypatch):
    monkeypatch.setattr(lease_keeper, "hold", lambda task_id, token: None)  # runs driven in this thread

    def run_in(world, project: Project) -> Run:
        return drive(run_start(workflow=world.workflow, project=project))

    return run_in


def open_team_a_breaker(world, driven) -> Run:
    """Two failing calls of team A's tool open its breaker; team A's third run is parked by it."""
    for _ in range(2):
        assert driven(world, world.team_a).status == Run.Status.NEEDS_ATTENTION
    parked = driven(world, world.team_a)
    assert parked.status == Run.Status.NEEDS_ATTENTION
    assert Task.objects.get(run=parked).failure_class == "breaker"
    return parked


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def inbox_api(user) -> dict:
    _, secret = api_token_create(user=user, scopes=["read"])
    response = Client().get("/api/v1/inbox", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 200, response.content
    return response.json()


def breaker_items(user) -> list[dict]:
    return [item for item in inbox_api(user)["items"] if item["kind"] == "breaker"]


# --- 4. Breakers and rate limits are the project's own ---------------------------------------------------


def test_4_a_failing_tool_of_one_project_never_opens_the_breaker_of_another_projects_tool(db, world, driven):
    open_team_a_breaker(world, driven)
    calls = world.healthy.calls
    run = driven(world, world.payments)
    assert run.status == Run.Status.COMPLETED, run.status_reason  # not "the tool … is failing"
    assert world.healthy.calls == calls + 1


def test_4_one_projects_calls_never_use_up_another_projects_rate_limit(db, world, monkeypatch):
    HttpTool.objects.update(rate_per_minute=2)
    now = 60.0 * 10**7 + 1  # one minute window of its own, so no boundary splits the calls
    monkeypatch.setattr("core.circuit.time", types.SimpleNamespace(time=lambda: now))
    world.broken.failing = False

    def call(project: Project, step: int):
        run = run_start(workflow=world.workflow, project=project)
        task = Task.objects.get(run=run)
        return tool_call(run=run, task=task, step=step, call_number=1, name=TOOL, arguments={"charge_id": "ch_1001"})

    assert [call(world.team_a, 1).error for _ in range(2)] == [None, None]
    assert call(world.team_a, 1).error["code"] == "rate_limited"  # team A's own limit holds
    answers = [call(world.payments, 1) for _ in range(2)]
    assert [a.error for a in answers] == [None, None]  # payments' two calls a minute are its own


def test_4_another_projects_people_never_see_a_projects_breaker_and_items_say_the_project(db, world, driven):
    open_team_a_breaker(world, driven)
    # Payments' people: nothing of team A's breaker, in the API or on the page.
    assert breaker_items(world.pat) == [] and breaker_items(world.olga) == []
    page = browser(world.olga).get("/inbox/").content.decode()
    assert TOOL not in page
    # Team A's admin: the breaker, named with its project, and closed at its project's address.
    [item] = breaker_items(world.mallory)
    assert item["id"] == f"tool:team-a:{TOOL}" and item["project"] == "team-a"
    assert item["url"] == f"/inbox/breakers/tool/team-a/{TOOL}/close"


def test_4_the_workers_page_lists_only_the_breakers_the_viewer_may_see(db, world, driven):
    open_team_a_breaker(world, driven)
    theirs = browser(world.mallory).get("/workers/").content.decode()
    row = re.search(r'<tr id="breaker-[^"]*">(.*?)</tr>', theirs, re.S)
    assert row and TOOL in row.group(1) and "team-a" in row.group(1) and "open" in row.group(1)
    others = browser(world.olga).get("/workers/")
    assert others.status_code == 200 and TOOL not in others.content.decode()


def test_4_metrics_tell_two_projects_tools_of_the_same_name_apart(db, world, driven):
    assert driven(world, world.payments).status == Run.Status.COMPLETED
    open_team_a_breaker(world, driven)
    text = metrics_text().decode()
    open_gauges = re.findall(r"^warden_breaker_open\{(.*)\} 1\.0$", text, re.M)
    assert any('project="team-a"' in labels and f'name="{TOOL}"' in labels for labels in open_gauges), open_gauges
    assert not any('project="payments"' in labels for labels in open_gauges)
    calls = re.findall(r"^warden_tool_calls_total\{(.*)\} ", text, re.M)
    assert any('project="payments"' in c and f'tool="{TOOL}"' in c and 'outcome="ok"' in c for c in calls), calls
    assert any('project="team-a"' in c and f'tool="{TOOL}"' in c and 'outcome="error"' in c for c in calls), calls


# --- 5. Closing respects projects; a breaker that closes by itself resumes what it parked ----------------


def open_payments_breaker(world, driven) -> list[Task]:
    """Payments' own service fails: its breaker opens and parks payments' runs (the one whose failure
    opened it, and the next). Returns the parked tasks."""
    world.healthy.failing = True
    for _ in range(3):
        driven(world, world.payments)
    parked = list(Task.objects.filter(run__project=world.payments, failure_class="breaker"))
    assert parked, [t.status_reason for t in Task.objects.all()]
    return parked


def statuses(tasks) -> set[str]:
    return set(Task.objects.filter(id__in=[t.id for t in tasks]).values_list("status", flat=True))


def test_5_another_projects_admin_can_neither_close_a_projects_breaker_nor_resume_its_tasks(db, world, driven):
    parked = open_payments_breaker(world, driven)
    open_team_a_breaker(world, driven)
    mine = list(Task.objects.filter(run__project=world.team_a, failure_class="breaker"))
    mallory = browser(world.mallory)
    for url in (f"/inbox/breakers/tool/{TOOL}/close", f"/inbox/breakers/tool/payments/{TOOL}/close"):
        assert mallory.post(url).status_code == 404  # never learns whether it exists
    assert statuses(parked) == {Task.Status.FAILED}
    assert not AuditEvent.objects.filter(actor=world.mallory, action="task_retry").exists()
    assert not AuditEvent.objects.filter(actor=world.mallory, action="breaker_close", outcome="done").exists()
    # Her attempt on payments' breaker is on payments' record, for payments' people to see.
    assert AuditEvent.objects.filter(actor=world.mallory, action="breaker_close", outcome="denied",
                                     project_id=world.payments.id).exists()  # fmt: skip
    # Her own project's breaker of the same name: closing it resumes her tasks, never payments'.
    assert mallory.post(f"/inbox/breakers/tool/team-a/{TOOL}/close").status_code == 302
    assert statuses(mine) == {Task.Status.READY} and statuses(parked) == {Task.Status.FAILED}
    retries = AuditEvent.objects.filter(actor=world.mallory, action="task_retry")
    assert set(retries.values_list("project_id", flat=True)) == {world.team_a.id}
    # Payments' operator may see its breaker, not close it; its admin closes it and resumes its tasks.
    assert browser(world.olga).post(f"/inbox/breakers/tool/payments/{TOOL}/close").status_code == 403
    world.healthy.failing = False
    assert browser(world.pat).post(f"/inbox/breakers/tool/payments/{TOOL}/close").status_code == 302
    assert {drive(t.run).status for t in parked} == {Run.Status.COMPLETED}
    pats = AuditEvent.objects.filter(actor=world.pat, action="task_retry", project_id=world.payments.id)
    assert pats.count() == len(parked)


def test_5_a_parked_task_stays_in_the_inbox_after_its_breaker_closed_by_itself_and_closing_resumes_it(
    db, world, driven, settings
):
    settings.WARDEN = {**settings.WARDEN, "TOOL_CIRCUIT_OPEN_SECONDS": 1}
    parked = open_payments_breaker(world, driven)
    time.sleep(1.2)  # its open period passes; no sweeper runs here, so nothing probes it
    world.healthy.failing = False
    [item] = breaker_items(world.pat)
    assert item["id"] == f"tool:payments:{TOOL}" and item["project"] == "payments"
    assert f"{len(parked)} tasks parked" in item["detail"], item
    response = browser(world.pat).post(item["url"])
    assert response.status_code == 302  # not a 404 while it lists tasks
    assert statuses(parked) == {Task.Status.READY}
    assert {drive(t.run).status for t in parked} == {Run.Status.COMPLETED}
    assert breaker_items(world.pat) == []


def test_5_a_breaker_that_closes_by_itself_resumes_every_task_it_parked(demo_tx, worker, django_user_model, settings):
    """With real workers and the sweeper: the breaker opens and parks three runs; after its open period
    the sweeper retries one as the probe, whose success closes it, and the other two are retried too."""
    settings.WARDEN = {**settings.WARDEN, "TOOL_CIRCUIT_FAILURES": 2, "TOOL_CIRCUIT_OPEN_SECONDS": 3}
    payments = Project.objects.create(slug="payments", name="Payments")
    service = ChargeService(failing=True)
    try:
        declare(payments, service)
        script = [{"tool": TOOL, "arguments": {"charge_id": "ch_1001"}}, {"final": {"answer": "{last}"}}]
        wf = scripted_workflow("charge-check", script, tools=[TOOL], max_attempts=3)
        runs = [run_start(workflow=wf.slug, project=payments) for _ in range(3)]

        def all_parked():
            tasks = Task.objects.filter(run__in=runs)
            return all(t.status == "failed" and t.failure_class == "breaker" for t in tasks)

        wait_for(all_parked, timeout=30, message="the three runs to be parked by the breaker")
        calls = service.calls
        service.failing = False
        for run in runs:
            wait_for(lambda run=run: Run.objects.get(id=run.id).status == Run.Status.COMPLETED, timeout=60,
                     message=f"run {run.id} resumed and completed")  # fmt: skip
        assert service.calls == calls + 3  # the probe, then the two others: nothing more
        retries = AuditEvent.objects.filter(action="task_retry", actor=None, via="system", project_id=payments.id)
        reasons = [r.detail["reason"] for r in retries.order_by("id")]
        assert len(reasons) == 3 and "probe" in reasons[0], reasons
        assert all(f"the tool {TOOL} of project payments" in r for r in reasons)
    finally:
        service.stop()
