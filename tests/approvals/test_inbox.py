"""The "needs you" inbox: one list, across a person's projects, of what waits for them (approvals they may
decide, ambiguous operations, runs needing attention, open breakers, blackboard entries), on the page,
in the API and as the nav's count; and closing a deployment's breaker, which only a superuser may do,
audited (a project's own tool's breakers: tests/security/test_breaker_findings.py)."""

import pytest
from django.test import Client

from policy.models import ApprovalRequest
from runs.heartbeat import lease_keeper
from runs.models import Run, Task
from runs.selectors.breakers import breakers_visible
from runs.services import run_start
from tenancy.access import default_project, membership_grant
from tenancy.models import AuditEvent, Project
from tenancy.tokens import api_token_create
from tests.conftest import wait_for
from tests.runs.test_engine import scripted_workflow
from tests.runs.test_run_actions import drive
from tools.broker import BREAKER
from tools.models import SandboxCall, ToolOperation


@pytest.fixture
def cast(demo_tx, django_user_model, settings):
    settings.WARDEN = {**settings.WARDEN, "TOOL_CIRCUIT_FAILURES": 2, "TOOL_CIRCUIT_OPEN_SECONDS": 300}
    users = django_user_model.objects
    people = {name: users.create_user(username=name, password=f"{name}-pass-1234") for name in
              ("olivia", "rita", "ada", "otto")}  # fmt: skip
    for name, role in (("olivia", "operator"), ("rita", "reviewer"), ("ada", "admin")):
        membership_grant(user=people[name], project=default_project(), role=role)
    membership_grant(user=people["otto"], project=Project.objects.create(slug="elsewhere", name="E"), role="admin")
    people["root"] = users.create_superuser(username="root", password="root-pass-1234", email="root@example.com")
    yield people
    BREAKER.reset(["crm.read"])


def _settled(run_id, *statuses):
    wait_for(lambda: Run.objects.get(id=run_id).status in statuses, timeout=60, message=f"run {run_id}: {statuses}")


def _api(user, **params):
    _, secret = api_token_create(user=user, scopes=["read"])
    response = Client().get("/api/v1/inbox", params, HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 200, response.content
    return response.json()


def _page(user, query="") -> str:
    client = Client()
    client.force_login(user)
    response = client.get(f"/inbox/{query}")
    assert response.status_code == 200
    return response.content.decode()


def test_each_person_sees_what_waits_for_them_and_nothing_else(cast, worker):
    olivia = cast["olivia"]
    proposed = run_start(workflow="incident-fanout", input={"propose_tools": ["email.send"]}, started_by=olivia)
    failed = run_start(workflow="incident-fanout", input={"faults": [{"task": "worker-3", "call": 4, "mode": "error"}]})
    unknown = run_start(
        workflow="incident-fanout", input={"faults": [{"task": "worker-4", "call": 3, "mode": "timeout_no_lookup"}]}
    )
    _settled(proposed.id, Run.Status.WAITING_FOR_APPROVAL)
    _settled(failed.id, Run.Status.NEEDS_ATTENTION)
    _settled(unknown.id, Run.Status.NEEDS_ATTENTION)
    # The other workers of a run needing attention finish their work (a crm.read that succeeds would
    # close the breaker this test opens).
    wait_for(lambda: not Task.objects.filter(status__in=["running", "retry_wait"]).exists(), timeout=60,
             message="every worker to finish")  # fmt: skip
    for _ in range(2):
        BREAKER.record("crm.read", ok=False)
    approval = ApprovalRequest.objects.get(run=proposed, parent=None)
    ambiguous = ToolOperation.objects.get(run=unknown, status=ToolOperation.Status.AMBIGUOUS)

    def ids(answer, kind):
        return [item["id"] for item in answer["items"] if item["kind"] == kind]

    # The reviewer: the approval, nothing an operator does.
    rita = _api(cast["rita"])
    assert ids(rita, "approval") == [str(approval.id)] and not ids(rita, "run") and not ids(rita, "breaker")
    # The operator who started the proposing run may not approve it: it does not wait for her. What an
    # operator acts on does: both runs, the ambiguous write, the breaker.
    mine = _api(olivia)
    assert not ids(mine, "approval")
    assert sorted(ids(mine, "run")) == sorted([str(failed.id), str(unknown.id)])
    assert ids(mine, "operation") == [str(ambiguous.id)] and ids(mine, "breaker") == ["tool:crm.read"]
    assert mine["counts"] == {
        "approval": 0, "question": 0, "operation": 1, "run": 2, "breaker": 1, "blackboard": 0, "change": 0
    }  # fmt: skip
    assert _api(olivia, kind="run")["items"] and all(i["kind"] == "run" for i in _api(olivia, kind="run")["items"])
    # Someone of another project: none of it, whatever their role there (not even the shared breaker,
    # which they may see as an admin of theirs; no run of this project).
    otto = _api(cast["otto"])
    assert not [i for i in otto["items"] if i["kind"] != "breaker"]
    assert _api(cast["otto"], project="elsewhere")["items"] == []

    page = _page(olivia)
    assert f"Run {failed.id} (incident-fanout) needs attention" in page and "crm.read is failing" in page
    assert f"/runs/{unknown.id}/operations/{ambiguous.id}/resolve" in page
    only_runs = _page(olivia, "?kind=run")
    assert f"Run {failed.id}" in only_runs and "crm.read is failing" not in only_runs
    assert 'id="nav-inbox"' in page
    count = Client()
    count.force_login(olivia)
    assert ">4</span>" in count.get("/inbox/counts").content.decode()


def test_a_project_of_someone_else_is_a_404_and_bad_filters_change_nothing(cast):
    _, secret = api_token_create(user=cast["otto"], scopes=["read"])
    client = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert client.get("/api/v1/inbox", {"project": "default"}).status_code == 404
    assert client.get("/api/v1/inbox", {"kind": "everything"}).status_code == 422
    assert Client().get("/api/v1/inbox").status_code == 401


def test_only_a_superuser_closes_a_deployment_breaker_and_refusals_are_audited(cast):
    for _ in range(2):
        BREAKER.record("crm.read", ok=False)
    assert BREAKER.open_for("crm.read")
    operator = Client()
    operator.force_login(cast["olivia"])
    assert operator.post("/inbox/breakers/tool/crm.read/close").status_code == 403
    assert BREAKER.open_for("crm.read")  # an operator's click closes nothing
    assert AuditEvent.objects.filter(action="breaker_close", outcome="denied", actor=cast["olivia"]).exists()
    # A registry tool's breaker is every project's: a project's admin is told who closes it.
    admin = Client()
    admin.force_login(cast["ada"])
    refused = admin.post("/inbox/breakers/tool/crm.read/close")
    assert refused.status_code == 403 and "closed by a superuser" in refused.content.decode()
    assert BREAKER.open_for("crm.read")
    root = Client()
    root.force_login(cast["root"])
    assert operator.get("/inbox/breakers/tool/crm.read/close").status_code == 405  # never by a GET
    response = root.post("/inbox/breakers/tool/crm.read/close", follow=True)
    assert "breaker is closed" in response.content.decode()
    assert not BREAKER.open_for("crm.read") and not BREAKER.open_now()
    assert AuditEvent.objects.filter(action="breaker_close", outcome="done", actor=cast["root"]).count() == 1
    assert not AuditEvent.objects.filter(action="breaker_close", outcome="done").exclude(actor=cast["root"]).exists()
    assert "crm.read is failing" not in _page(cast["ada"])


def test_an_open_breaker_parks_the_tasks_that_need_it_and_closing_it_resumes_them(cast, worker, settings):
    for _ in range(2):
        BREAKER.record("email.send", ok=False)
    run = run_start(workflow="incident-fanout", started_by=cast["olivia"])
    _settled(run.id, Run.Status.NEEDS_ATTENTION)
    wait_for(lambda: not run.tasks.filter(status="running").exists(), timeout=30, message="the workers to park")
    run.refresh_from_db()
    assert "failed (breaker): the tool email.send is failing: its breaker is open" in run.status_reason
    parked = run.tasks.filter(status="failed", failure_class="breaker").count()
    assert parked
    assert not SandboxCall.objects.filter(tool="email.send").exists()  # nothing reached the mail system
    waiting = _api(cast["olivia"])
    assert [i["id"] for i in waiting["items"] if i["kind"] == "breaker"] == ["tool:email.send"]
    assert str(run.id) in [i["id"] for i in waiting["items"] if i["kind"] == "run"]

    root = Client()
    root.force_login(cast["root"])
    root.post("/inbox/breakers/tool/email.send/close")
    _settled(run.id, Run.Status.COMPLETED)
    # Each e-mail went out once; the tickets and record changes made before the breaker were not repeated.
    effects = SandboxCall.objects.filter(is_effect=True)
    assert effects.filter(tool="email.send").count() == 5
    assert effects.filter(tool="tickets.create").count() == 5 and effects.filter(tool="crm.update").count() == 5
    assert AuditEvent.objects.filter(action="task_retry", actor=cast["root"]).count() == parked


# --- closing a breaker: what is not there, and the deployment's for every project -------------------------


@pytest.fixture
def parked_everywhere(cast, monkeypatch):
    """crm.read (a registry tool: the deployment's breaker) parked a run of the default project and one
    of "elsewhere"."""
    monkeypatch.setattr(lease_keeper, "hold", lambda task_id, token: None)
    for _ in range(2):
        BREAKER.record("crm.read", ok=False)
    wf = scripted_workflow("reader", [{"tool": "crm.read", "arguments": {"customer_id": "c1"}}, {"final": {}}],
                           tools=["crm.read"])  # fmt: skip
    projects = Project.objects.filter(slug__in=["default", "elsewhere"])
    runs = [drive(run_start(workflow=wf.slug, project=p)) for p in projects]
    assert {t.failure_class for t in Task.objects.filter(run__in=runs)} == {"breaker"}
    return runs


@pytest.mark.parametrize(
    "url",
    [
        "/inbox/breakers/switch/crm.read/close",  # no such kind of breaker
        "/inbox/breakers/tool/no-such-project/crm.read/close",  # no such project
        "/inbox/breakers/provider/default/openai/close",  # a provider's breaker is no project's
        "/inbox/breakers/tool/email.send/close",  # not open, nothing parked
        "/inbox/breakers/tool/default/crm.read/close",  # the default project has no tool of its own by that name
        "/inbox/breakers/provider/openai/close",
    ],
)
def test_closing_a_breaker_that_is_not_there_answers_404_and_changes_nothing(parked_everywhere, cast, url):
    root = Client()
    root.force_login(cast["root"])
    response = root.post(url)
    assert response.status_code == 404 and "breaker" in response.content.decode()
    assert BREAKER.open_for("crm.read")
    assert set(Task.objects.values_list("status", flat=True)) == {"failed"}
    assert not AuditEvent.objects.filter(action__in=["breaker_close", "task_retry"], outcome="done").exists()


def test_a_superuser_closing_a_deployment_breaker_resumes_the_tasks_of_every_project(parked_everywhere, cast):
    # The admin of "elsewhere" sees the breaker (it parked a task of hers), and may not close it.
    admin = Client()
    admin.force_login(cast["otto"])
    [item] = [i for i in _api(cast["otto"])["items"] if i["kind"] == "breaker"]
    assert item["id"] == "tool:crm.read" and item["project"] == "" and "1 task parked" in item["detail"]
    assert admin.post(item["url"]).status_code == 403
    root = Client()
    root.force_login(cast["root"])
    assert root.post(item["url"]).status_code == 302
    assert set(Task.objects.values_list("status", flat=True)) == {"ready"}
    retried = AuditEvent.objects.filter(action="task_retry", actor=cast["root"])
    assert set(retried.values_list("project_id", flat=True)) == {r.project_id for r in parked_everywhere}


def test_the_breakers_a_person_sees_cost_three_queries(parked_everywhere, cast, django_assert_num_queries):
    BREAKER.record("payments.get_charge", ok=False, project_id=Project.objects.get(slug="elsewhere").id)
    BREAKER.record("payments.get_charge", ok=False, project_id=Project.objects.get(slug="elsewhere").id)
    with django_assert_num_queries(3):  # the person's projects, the parked tasks, the projects' slugs
        rows = breakers_visible(cast["otto"])
    assert [r.id for r in rows] == ["tool:crm.read", "tool:elsewhere:payments.get_charge"]
    assert [r.id for r in breakers_visible(cast["olivia"])] == ["tool:crm.read"]
