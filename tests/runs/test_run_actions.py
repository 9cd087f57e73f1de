"""The dashboard's operator actions on a run (dashboard/views/run_actions.py), from the outside: who may open
and confirm each page, what the preview says, what a confirmed action does and records, and that a
refusal, a GET or a request without its CSRF token changes nothing."""

import dataclasses
import re
from types import SimpleNamespace

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from runs.blackboard import knowledge
from runs.heartbeat import lease_keeper
from runs.models import BlackboardEntry, Run, Span, Task
from runs.services import run_cancel, run_start, task_execute
from tenancy.access import default_project, membership_grant
from tenancy.models import AuditEvent, Project
from tools import registry
from tools.installation import run_key_prefix
from tools.models import ToolOperation

OS = ToolOperation.Status
EMAIL_FAILS = {"faults": [{"task": "worker-3", "call": 4, "mode": "error"}]}


def drive(run: Run) -> Run:
    """Execute the run's ready tasks in this thread until it stops (no worker, no broker: fast)."""
    for _ in range(20):
        ready = list(run.tasks.filter(status=Task.Status.READY).values_list("id", flat=True))
        if not ready or Run.objects.get(id=run.id).status != Run.Status.RUNNING:
            break
        for task_id in ready:
            task_execute(run_id=run.id, task_id=task_id)
    run.refresh_from_db()
    return run


@pytest.fixture
def stopped_run(demo, monkeypatch):
    """Starts incident-fanout with the given input and drives it until it needs attention."""
    monkeypatch.setattr(lease_keeper, "hold", lambda task_id, token: None)  # no heartbeat thread in a test

    def start(input=EMAIL_FAILS) -> SimpleNamespace:
        run = drive(run_start(workflow="incident-fanout", input=input))
        assert run.status == Run.Status.NEEDS_ATTENTION, run.status_reason
        w3 = Task.objects.get(run=run, key="worker-3")
        ops = {op.tool: op for op in ToolOperation.objects.filter(task=w3)}
        # What worker-3 wrote on the blackboard before it failed (a model's claim, not yet verified).
        entry = BlackboardEntry.objects.create(
            run=run, key="affected-customers", version=1, kind="number", value=5, author_task=w3, author_step=1
        )
        return SimpleNamespace(run=run, w3=w3, ops=ops, entry=entry)

    return start


@pytest.fixture
def scene(stopped_run):
    """Worker-3's e-mail failed for good after its ticket and CRM update: the run needs attention."""
    return stopped_run()


@pytest.fixture
def people(operator, django_user_model):
    home, other = default_project(), Project.objects.create(slug="elsewhere", name="Elsewhere")
    users = {"operator": operator}
    for role in ("viewer", "reviewer"):
        users[role] = django_user_model.objects.create_user(username=role, password=f"{role}-pass-123")
        membership_grant(user=users[role], project=home, role=role)
    users["outsider"] = django_user_model.objects.create_user(username="outsider", password="outsider-pass-123")
    membership_grant(user=users["outsider"], project=other, role="admin")
    return users


def as_user(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def state(run: Run) -> tuple:
    """Everything an action could change, and the audit rows of actions done."""
    return (
        Run.objects.filter(id=run.id).values_list("status", "status_reason").get(),
        list(run.tasks.order_by("id").values_list("status", "journal_epoch", "max_attempts")),
        list(ToolOperation.objects.filter(run=run).order_by("id").values_list("status", "status_reason")),
        list(Span.objects.filter(run=run).order_by("id").values_list("step", flat=True)),
        list(BlackboardEntry.objects.filter(run=run).values_list("verification", "verified_by", "note")),
        AuditEvent.objects.filter(run_id=run.id, outcome="done").count(),
    )


def detail(run: Run) -> str:
    return reverse("runs:detail", args=[run.id])


def done(run: Run, action: str) -> AuditEvent:
    return AuditEvent.objects.get(run=run, action=action, outcome="done")


def assert_strict_page(response) -> None:
    """The site's CSP allows no inline style or script: the pages have none."""
    html = response.content.decode()
    assert " style=" not in html
    assert not re.search(r"<script(?![^>]*\bsrc=)", html)


# --- who may do what: every action --------------------------------------------------------------------

ACTIONS = {
    "cancel": (lambda s: reverse("runs:cancel", args=[s.run.id]), {"reason": "stop"}),
    "resume": (lambda s: reverse("runs:resume", args=[s.run.id]), {}),
    "compensate": (lambda s: reverse("runs:compensate", args=[s.run.id]), {"reason": "undo"}),
    "task retry": (lambda s: reverse("runs:task-retry", args=[s.run.id, s.w3.id]), {}),
    "task retry from a step": (
        lambda s: reverse("runs:task-retry", args=[s.run.id, s.w3.id]) + "?from_step=6",
        {"from_step": "6", "repeat": "6"},
    ),
    "fork from a step": (
        lambda s: reverse("runs:fork", args=[s.run.id]) + "?task=worker-3&step=8",
        {"task": "worker-3", "step": "8"},
    ),
    "operation resolve": (
        lambda s: reverse("runs:operation-resolve", args=[s.run.id, s.ops["email.send"].id]),
        {"committed": "no", "note": "checked"},
    ),
    "blackboard decide": (
        lambda s: reverse("runs:blackboard-decide", args=[s.run.id, s.entry.id]),
        {"verdict": "rejected", "note": "only four customers were affected"},
    ),
}


@pytest.mark.parametrize("action", ACTIONS)
def test_an_operator_sees_the_confirmation_page_and_a_get_changes_nothing(scene, people, action):
    url, _ = ACTIONS[action]
    before = state(scene.run)
    response = as_user(people["operator"]).get(url(scene))
    assert response.status_code == 200
    assert f"Run {scene.run.id}" in response.content.decode()
    assert_strict_page(response)
    assert state(scene.run) == before


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("role", ["viewer", "reviewer"])
def test_a_viewer_or_reviewer_is_refused_with_403_and_nothing_changes(scene, people, action, role):
    url, data = ACTIONS[action]
    before = state(scene.run)
    client = as_user(people[role])
    assert client.get(url(scene)).status_code == 403
    assert client.post(url(scene), data).status_code == 403
    assert state(scene.run) == before
    assert AuditEvent.objects.filter(actor=people[role], action="denied:operate", outcome="denied").count() == 2


@pytest.mark.parametrize("action", ACTIONS)
def test_an_outsider_gets_404_as_if_the_run_did_not_exist(scene, people, action):
    url, data = ACTIONS[action]
    before = state(scene.run)
    client = as_user(people["outsider"])
    assert client.get(url(scene)).status_code == 404
    assert client.post(url(scene), data).status_code == 404
    assert state(scene.run) == before


@pytest.mark.parametrize("action", ACTIONS)
def test_anonymous_is_sent_to_log_in(scene, client, action):
    url, data = ACTIONS[action]
    before = state(scene.run)
    for response in (client.get(url(scene)), client.post(url(scene), data)):
        assert response.status_code == 302 and response["Location"].startswith("/login/?next=")
    assert state(scene.run) == before


def test_the_post_needs_its_csrf_token(scene, people):
    client = Client(enforce_csrf_checks=True)
    client.force_login(people["operator"])
    url = reverse("runs:cancel", args=[scene.run.id])
    page = client.get(url)
    before = state(scene.run)
    assert client.post(url, {"reason": "no token"}).status_code == 403
    assert state(scene.run) == before
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)
    response = client.post(url, {"reason": "with the token", "csrfmiddlewaretoken": token})
    assert response.status_code == 303 and Run.objects.get(id=scene.run.id).status == Run.Status.CANCELLED


def test_unknown_tasks_and_operations_or_those_of_another_run_are_404(scene, people):
    other = run_start(workflow="deploy-review")
    client = as_user(people["operator"])
    before = state(scene.run)
    foreign_task = other.tasks.first().id
    assert client.get(reverse("runs:task-retry", args=[scene.run.id, foreign_task])).status_code == 404
    assert client.post(reverse("runs:task-retry", args=[scene.run.id, foreign_task])).status_code == 404
    assert client.get(reverse("runs:task-retry", args=[other.id, scene.w3.id])).status_code == 404
    op = scene.ops["email.send"].id
    assert (
        client.post(reverse("runs:operation-resolve", args=[other.id, op]), ACTIONS["operation resolve"][1]).status_code
        == 404
    )
    assert client.get(reverse("runs:operation-resolve", args=[scene.run.id, 10**9])).status_code == 404
    assert client.get(reverse("runs:cancel", args=[10**9])).status_code == 404
    assert state(scene.run) == before


# --- cancel -----------------------------------------------------------------------------------------------


def test_cancel_previews_then_cancels_with_the_reason_and_an_audit_row(demo, people):
    run = run_start(workflow="deploy-review")
    client = as_user(people["operator"])
    url = reverse("runs:cancel", args=[run.id])
    page = client.get(url).content.decode()
    assert "Tasks that will not start" in page and "inventory" in page and "risk" in page

    before = state(run)
    response = client.post(url, {"reason": "  "})
    assert response.status_code == 400 and "a reason is required" in response.content.decode()
    assert state(run) == before

    response = client.post(url, {"reason": "wrong service"})
    assert response.status_code == 303 and response["Location"] == detail(run)
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED and run.status_reason == "wrong service"
    assert set(run.tasks.values_list("status", flat=True)) == {Task.Status.CANCELLED}
    event = done(run, "run_cancel")
    assert event.actor == people["operator"] and event.via == "page" and event.detail == {"reason": "wrong service"}
    assert [str(m) for m in get_messages(response.wsgi_request)] == [f"Run {run.id} is cancelled."]

    response = client.post(url, {"reason": "again"})  # the state machine refuses: nothing changes
    assert (
        response.status_code == 409
        and "is cancelled; it cannot be cancelled (already finished)" in response.content.decode()
    )
    assert Run.objects.get(id=run.id).status_reason == "wrong service"
    assert AuditEvent.objects.filter(run=run, action="run_cancel", outcome="denied").count() == 1


# --- resume -----------------------------------------------------------------------------------------------


def test_resume_lists_the_failed_task_and_resumes_a_run_that_needs_attention(scene, people):
    client = as_user(people["operator"])
    url = reverse("runs:resume", args=[scene.run.id])
    page = client.get(url).content.decode()
    assert "worker-3" in page and "the email system refused the request" in page
    assert reverse("runs:task-retry", args=[scene.run.id, scene.w3.id]) in page
    assert "Tasks sent to a worker again" in page and "worker-4" in page

    response = client.post(url, {"reason": "the failed e-mail can wait"})
    assert response.status_code == 303 and response["Location"] == detail(scene.run)
    scene.run.refresh_from_db()
    assert scene.run.status == Run.Status.RUNNING and scene.run.status_reason == "the failed e-mail can wait"
    assert Task.objects.get(id=scene.w3.id).status == Task.Status.FAILED  # resuming retries nothing
    assert done(scene.run, "run_resume").detail == {"reason": "the failed e-mail can wait"}

    before = state(scene.run)
    response = client.post(url, {})
    assert response.status_code == 409 and "only a run that needs attention can be resumed" in response.content.decode()
    assert state(scene.run) == before


# --- compensate -------------------------------------------------------------------------------------------


def test_compensate_previews_the_plan_then_starts_it(scene, people):
    client = as_user(people["operator"])
    url = reverse("runs:compensate", args=[scene.run.id])
    page = client.get(url).content.decode()
    assert "undone by tickets.close" in page and "undone by crm.restore" in page
    assert "corrected by email.send once a reviewer approves it" in page  # the e-mails of workers 1 and 2

    before = state(scene.run)
    assert client.post(url, {"reason": ""}).status_code == 400
    assert state(scene.run) == before

    response = client.post(url, {"reason": "incident rolled back"})
    assert response.status_code == 303 and response["Location"] == detail(scene.run)
    assert Run.objects.get(id=scene.run.id).status == Run.Status.COMPENSATING
    committed = ToolOperation.objects.filter(run=scene.run, kind="action").exclude(tool_class="read_only")
    assert set(committed.exclude(status=OS.FAILED).values_list("status", flat=True)) == {OS.COMPENSATING}
    event = done(scene.run, "run_compensate")
    assert event.detail["reason"] == "incident rolled back" and len(event.detail["undo"]) == 6
    assert len(event.detail["correct"]) == 2


def test_compensation_waits_until_ambiguous_operations_are_resolved(ambiguous, people):
    client = as_user(people["operator"])
    url = reverse("runs:compensate", args=[ambiguous.run.id])
    page = client.get(url).content.decode()
    email = ambiguous.ops["email.send"]
    assert "Resolve these first" in page
    assert reverse("runs:operation-resolve", args=[ambiguous.run.id, email.id]) in page
    before = state(ambiguous.run)
    response = client.post(url, {"reason": "undo"})
    assert response.status_code == 409 and "resolve them before compensating" in response.content.decode()
    assert state(ambiguous.run) == before


# --- retry a task -----------------------------------------------------------------------------------------


def test_a_plain_retry_previews_the_failed_call_and_retries_with_the_same_keys(scene, people):
    client = as_user(people["operator"])
    url = reverse("runs:task-retry", args=[scene.run.id, scene.w3.id])
    page = client.get(url).content.decode()
    assert "A plain retry" in page and "Steps 1 to 7 are replayed" in page
    assert f"{run_key_prefix(scene.run.id)}worker-3:8" in page and "called again with the same key" in page
    for step in range(1, 9):  # the picker offers every journaled step, and the one that did not finish
        assert f'name="from_step" value="{step}"' in page

    response = client.post(url, {"from_step": ""})
    assert response.status_code == 303
    w3 = Task.objects.get(id=scene.w3.id)
    assert w3.status == Task.Status.READY and w3.journal_epoch == 0
    assert Run.objects.get(id=scene.run.id).status == Run.Status.RUNNING
    assert done(scene.run, "task_retry").target == f"task {w3.id} (worker-3)"

    before = state(scene.run)
    response = client.post(url, {})  # no longer failed
    assert (
        response.status_code == 409
        and "task worker-3 is ready; only a failed task can be retried" in response.content.decode()
    )
    assert state(scene.run) == before


def test_a_retry_from_a_step_reuses_committed_effects_unless_one_is_chosen_to_repeat(scene, people):
    client = as_user(people["operator"])
    url = reverse("runs:task-retry", args=[scene.run.id, scene.w3.id])
    update = scene.ops["crm.update"]
    page = client.get(url, {"from_step": update.step}).content.decode()
    assert f"A retry from step {update.step}" in page
    assert "its receipt answers the same call again: not repeated" in page
    assert "1 committed effect is not repeated" in page and "happen a second time" not in page
    assert f'name="repeat" value="{update.step}">' in page
    assert f'value="{update.step}" checked' in page
    chosen = client.get(url, {"from_step": update.step, "repeat": update.step}).content.decode()
    assert f"chosen to happen AGAIN under {run_key_prefix(scene.run.id)}worker-3:{update.step}:e1" in chosen
    assert "1 committed effect will happen a second time once a reviewer approves it" in chosen

    before = state(scene.run)
    response = client.post(url, {"from_step": str(update.step), "repeat": "4"})  # the ticket: before the step
    assert response.status_code == 400 and "steps 4 have no committed effect" in response.content.decode()
    assert state(scene.run) == before

    reason = "the CRM record was overwritten by hand"
    response = client.post(url, {"from_step": str(update.step), "repeat": str(update.step), "reason": reason})
    assert response.status_code == 303 and response["Location"] == detail(scene.run)
    w3 = Task.objects.get(id=scene.w3.id)
    assert w3.status == Task.Status.READY and w3.journal_epoch == 1
    assert list(Span.objects.filter(task=w3, step__isnull=False).values_list("step", flat=True)) == [1, 2, 3, 4, 5]
    assert ToolOperation.objects.get(id=update.id).repeat_chosen
    event = done(scene.run, "task_retry_from")
    assert event.detail == {
        "reason": reason,
        "task": "worker-3",
        "from_step": update.step,
        "journal_epoch": 1,
        "re_executed": [6, 7],
        "reused_receipts": [],
        "repeated_operations": [update.id],
    }


def test_fork_from_here_previews_what_is_new_and_inherited_then_forks_into_a_new_run(scene, people):
    client = as_user(people["operator"])
    page = client.get(detail(scene.run)).content.decode()
    fork_url = reverse("runs:fork", args=[scene.run.id])
    assert f'href="{fork_url}?task=worker-3">Fork from here: worker-3…' in page
    Run.objects.filter(id=scene.run.id).update(input={})  # the e-mail system is repaired; the fork copies it

    page = client.get(fork_url, {"task": "worker-3"}).content.decode()  # the step it failed at, offered first
    assert "A fork from worker-3 step 8" in page and 'value="8" checked' in page
    new_calls = re.findall(r'<tr class="new-call"><td>([^<]*)</td><td>(\d+)</td><td>([^<]*)</td>', page)
    assert new_calls == [("worker-3", "8", "email.send")]
    inherited = re.findall(r'<tr class="inherited"><td>([^<]*)</td><td>(\d+)</td><td>([^<]*)</td>', page)
    assert ("worker-3", "4", "tickets.create") in inherited and ("worker-3", "6", "crm.update") in inherited
    # Driven in order, workers 4 and 5 never started before the run stopped: they go on in the fork.
    assert len(inherited) == 2 * 3 + 2 and "Fork from worker-3 step 8</button>" in page
    assert page.count("goes on from step 1, its journal replayed") == 2

    before = state(scene.run)
    for bad, message in (({"task": "worker-3", "step": "99"}, "not 99"), ({"task": "nope", "step": "1"}, "no task")):
        response = client.post(fork_url, bad)
        assert response.status_code == 400 and message in response.content.decode()
    assert state(scene.run) == before and not Run.objects.filter(forked_from=scene.run).exists()

    response = client.post(fork_url, {"task": "worker-3", "step": "8", "reason": "mail is back"})
    fork = Run.objects.get(forked_from=scene.run)
    assert response.status_code == 303 and response["Location"] == detail(fork)
    assert (fork.forked_task, fork.forked_step) == ("worker-3", 8)
    assert done(scene.run, "run_fork").detail["fork"] == fork.id
    assert drive(fork).status == Run.Status.COMPLETED, fork.status_reason
    page = client.get(detail(fork)).content.decode()
    assert f'Forked from <a href="{detail(scene.run)}">run {scene.run.id}</a> at task worker-3, step 8' in page


@pytest.mark.parametrize(
    ("from_step", "status", "message"),
    [
        ("six", 400, "must be a whole number, not &#x27;six&#x27;"),
        ("99", 400, "a retry may start from step 1 to 8, not 99"),
        ("0", 400, "a retry may start from step 1 to 8, not 0"),
    ],
)
def test_a_bad_step_is_refused_and_nothing_changes(scene, people, from_step, status, message):
    client = as_user(people["operator"])
    url = reverse("runs:task-retry", args=[scene.run.id, scene.w3.id])
    before = state(scene.run)
    get = client.get(url, {"from_step": from_step})
    assert message in get.content.decode()
    response = client.post(url, {"from_step": from_step})
    assert response.status_code == status and message in response.content.decode()
    assert state(scene.run) == before


def test_a_task_that_did_not_fail_cannot_be_retried(scene, people):
    plan = Task.objects.get(run=scene.run, key="plan")
    client = as_user(people["operator"])
    url = reverse("runs:task-retry", args=[scene.run.id, plan.id])
    page = client.get(url, {"from_step": "1"}).content.decode()
    assert (
        "task plan is completed; only a failed task can be retried" in page and "Retry from step 1</button>" not in page
    )
    before = state(scene.run)
    response = client.post(url, {"from_step": "1"})
    assert response.status_code == 409 and "only a failed task can be retried" in response.content.decode()
    assert state(scene.run) == before


# --- resolve an ambiguous operation ----------------------------------------------------------------------


@pytest.fixture
def ambiguous(stopped_run, monkeypatch):
    """Worker-3's e-mail timed out after it was sent, on a system without a status lookup: nobody knows."""
    spec = registry.TOOLS["email.send"]
    monkeypatch.setitem(registry.TOOLS, "email.send", dataclasses.replace(spec, lookup=None))
    scene = stopped_run({"faults": [{"task": "worker-3", "call": 4, "mode": "timeout_after_commit"}]})
    assert scene.ops["email.send"].status == OS.AMBIGUOUS
    return scene


def test_an_ambiguous_operation_is_resolved_with_what_the_operator_found(ambiguous, people):
    client = as_user(people["operator"])
    email = ambiguous.ops["email.send"]
    url = reverse("runs:operation-resolve", args=[ambiguous.run.id, email.id])
    page = client.get(url).content.decode()
    assert email.idempotency_key in page and "worker-3@customers.example" in page
    assert "none: only a person can tell whether this happened" in page

    before = state(ambiguous.run)
    response = client.post(url, {"note": "<script>alert(1)</script>"})  # no verdict
    text = response.content.decode()
    assert response.status_code == 400 and "say whether the effect is in the outside system" in text
    assert "<script>alert(1)</script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert client.post(url, {"committed": "yes", "note": " "}).status_code == 400
    assert state(ambiguous.run) == before

    response = client.post(url, {"committed": "yes", "note": "in the sent folder at 10:02"})
    assert response.status_code == 303 and response["Location"] == detail(ambiguous.run)
    email.refresh_from_db()
    assert email.status == OS.COMMITTED
    assert email.status_reason == "resolved by an operator: committed (in the sent folder at 10:02)"
    event = done(ambiguous.run, "operation_resolve")
    assert event.target == f"operation {email.id}"
    assert event.detail == {"committed": True, "note": "in the sent folder at 10:02"}

    response = client.post(url, {"committed": "no", "note": "changed my mind"})
    assert response.status_code == 409 and "only an ambiguous one can be resolved" in response.content.decode()
    assert Run.objects.get(id=ambiguous.run.id).status == Run.Status.NEEDS_ATTENTION


def test_a_retry_from_before_an_unresolved_operation_waits_for_it(ambiguous, people):
    client = as_user(people["operator"])
    url = reverse("runs:task-retry", args=[ambiguous.run.id, ambiguous.w3.id])
    page = client.get(url, {"from_step": "6"}).content.decode()
    email = ambiguous.ops["email.send"]
    assert "resolve them before executing their steps afresh" in page
    assert reverse("runs:operation-resolve", args=[ambiguous.run.id, email.id]) in page
    before = state(ambiguous.run)
    response = client.post(url, {"from_step": "6"})
    assert response.status_code == 409 and state(ambiguous.run) == before


def test_cancel_of_a_run_that_is_cancelling_is_refused(demo, people):
    run = run_start(workflow="deploy-review")
    Task.objects.filter(run=run, key="risk").update(status=Task.Status.RUNNING)
    run_cancel(run_id=run.id, reason="first")
    client = as_user(people["operator"])
    page = client.get(reverse("runs:cancel", args=[run.id])).content.decode()
    assert "it cannot be cancelled" in page and "Cancel the run</button>" not in page


# --- blackboard entries -----------------------------------------------------------------------------------


def test_an_operator_verifies_a_blackboard_entry_and_the_tasks_are_given_it(scene, people):
    client = as_user(people["operator"])
    url = reverse("runs:blackboard-decide", args=[scene.run.id, scene.entry.id])
    assert (
        reverse("runs:blackboard-decide", args=[scene.run.id, scene.entry.id])
        in client.get(detail(scene.run)).content.decode()
    )
    assert knowledge(scene.run.id) == []  # unverified: no task is given it
    page = client.get(url).content.decode()
    assert "affected-customers" in page and "written by</dt><dd>task worker-3 · step 1" in page
    response = client.post(url, {"verdict": "verified", "note": ""})
    assert response.status_code == 303
    given = knowledge(scene.run.id)
    assert [(e["key"], e["value"], e["verified_by"]) for e in given] == [("affected-customers", 5, "olivia (operator)")]
    event = done(scene.run, "blackboard_decide")
    assert event.actor == people["operator"] and event.detail["verdict"] == "verified"
    assert "affected-customers v1 is verified" in [str(m) for m in get_messages(response.wsgi_request)][0]


def test_rejecting_a_blackboard_entry_needs_a_note_and_withdraws_it_from_the_tasks(scene, people):
    client = as_user(people["operator"])
    url = reverse("runs:blackboard-decide", args=[scene.run.id, scene.entry.id])
    client.post(url, {"verdict": "verified"})
    before = state(scene.run)
    response = client.post(url, {"verdict": "rejected", "note": "  "})
    assert response.status_code == 400 and "say why the entry is wrong" in response.content.decode()
    assert client.post(url, {"verdict": "maybe", "note": "x"}).status_code == 400
    assert state(scene.run) == before
    client.post(url, {"verdict": "rejected", "note": "only four customers were affected"})
    scene.entry.refresh_from_db()
    assert scene.entry.verification == "rejected" and scene.entry.note == "only four customers were affected"
    assert knowledge(scene.run.id) == []


def test_a_blackboard_entry_of_another_run_is_404(scene, people):
    other = run_start(workflow="deploy-review")
    client = as_user(people["operator"])
    before = state(scene.run)
    assert (
        client.post(
            reverse("runs:blackboard-decide", args=[other.id, scene.entry.id]), {"verdict": "verified"}
        ).status_code
        == 404
    )
    assert state(scene.run) == before
