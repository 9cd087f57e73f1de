"""Forking a run from a task's step (runs/services/fork.py), on drill B's incident-fanout: worker-3's e-mail
fails for good at its fourth call, after its ticket and its CRM update. Effects are counted in the sandbox
systems, from outside the engine."""

import json

import pytest

from core.errors import Conflict, InvalidInput, NotFound
from runs.models import Artifact, Run, Span, Task
from runs.services import run_fork, run_fork_preview, run_resume, run_start
from tenancy.access import default_project, membership_grant
from tenancy.models import AuditEvent
from tenancy.tokens import api_token_create
from tests.conftest import wait_for
from tools.installation import run_key_prefix
from tools.models import SandboxCall, ToolOperation

EMAIL_FAILS = {"faults": [{"task": "worker-3", "call": 4, "mode": "error"}]}


# Every task of incident-fanout's fan-out gets a thread at once: a test whose two workers both fail must
# not find one of them still unclaimed (and so never run) when the other's failure stops the run.
WORKER_THREADS = 8


def stopped(run, statuses=(Run.Status.COMPLETED, Run.Status.NEEDS_ATTENTION, Run.Status.FAILED)) -> Run:
    wait_for(lambda: Run.objects.get(id=run.id).status in statuses, message=f"run {run.id} to stop")
    wait_for(lambda: not run.tasks.filter(status=Task.Status.RUNNING).exists(), message="attempts in flight to end")
    run.refresh_from_db()
    return run


def effects(**where) -> list[tuple[str, str]]:
    return sorted(SandboxCall.objects.filter(is_effect=True, **where).values_list("tool", "idempotency_key"))


def journal(task) -> list[int]:
    return list(Span.objects.filter(task=task, step__isnull=False).order_by("step").values_list("step", flat=True))


@pytest.fixture
def failed(demo_tx, worker):
    """Run (needs attention), worker-3 (failed after journaling steps 1-7: read, ticket, CRM update and the
    model's ask for the e-mail) and the step of its e-mail call (call 4)."""
    run = stopped(run_start(workflow="incident-fanout", input=EMAIL_FAILS))
    assert run.status == Run.Status.NEEDS_ATTENTION and "worker-3" in run.status_reason, run.status_reason
    w3 = Task.objects.get(run=run, key="worker-3")
    assert w3.status == Task.Status.FAILED and journal(w3) == list(range(1, 8))
    email = ToolOperation.objects.get(task=w3, tool="email.send")
    assert email.status == ToolOperation.Status.FAILED and email.call_number == 4
    # The e-mail system is repaired (the drill's fault fires on every call); the fork copies the input.
    Run.objects.filter(id=run.id).update(input={})
    run.refresh_from_db()
    return run, w3, email.step


def test_a_fork_from_the_failed_email_inherits_the_ticket_and_update_and_sends_the_email_once(failed):
    run, w3, step = failed
    before = effects()
    old = f"{run_key_prefix(run.id)}worker-3"
    assert [(t, k) for t, k in before if k.startswith(f"{old}:")] == [
        ("crm.update", f"{old}:6"),
        ("tickets.create", f"{old}:4"),
    ]

    preview = run_fork_preview(run_id=run.id, task_key="worker-3", step=step)
    assert preview["refusal"] == ""
    fates = {t["key"]: t["fate"] for t in preview["tasks"]}
    # Workers still mid-way when the run stopped (a yielded slice) go on from their last step in the fork.
    finished = {t.key for t in run.tasks.all() if t.status == Task.Status.COMPLETED}
    assert fates == {
        **{key: "completed" if key in finished else "continues" for key in fates},
        "worker-3": "forked",
        "summary": "starts_over",
    }
    new_calls = [(c["task"], c["step"], c["tool"]) for c in preview["new_calls"] if fates[c["task"]] != "continues"]
    assert new_calls == [("worker-3", step, "email.send")]
    inherited = {(e["task"], e["tool"]) for e in preview["inherited_effects"]}
    assert ("worker-3", "tickets.create") in inherited and ("worker-3", "crm.update") in inherited
    assert ("worker-3", "email.send") not in inherited and len(preview["inherited_effects"]) == len(before)
    assert [s["step"] for s in preview["replayed"]] == list(range(1, step))
    assert not Run.objects.filter(forked_from=run).exists()  # a preview changes nothing

    fork = run_fork(run_id=run.id, task_key="worker-3", step=step, reason="the mail server is back", via="test")
    assert (fork.forked_from_id, fork.forked_task, fork.forked_step) == (run.id, "worker-3", step)
    fork = stopped(fork)
    assert fork.status == Run.Status.COMPLETED, fork.status_reason

    new = f"{run_key_prefix(fork.id)}worker-3"
    assert effects(idempotency_key__startswith=f"{new}:") == [("email.send", f"{new}:{step}:e1")]
    # Across both runs, each customer got one ticket, one CRM update and one e-mail: nothing was repeated.
    for tool in ("tickets.create", "crm.update", "email.send"):
        assert SandboxCall.objects.filter(is_effect=True, tool=tool).count() == 5, tool
    f3 = Task.objects.get(run=fork, key="worker-3")
    assert f3.status == Task.Status.COMPLETED and journal(f3) == list(range(1, step + 2))
    receipts = ToolOperation.objects.filter(run=fork, inherited_from__isnull=False)
    assert receipts.count() == len(before) and not receipts.filter(attempts__gt=0).exists()
    assert set(receipts.filter(task=f3).values_list("tool", "idempotency_key")) == {
        ("tickets.create", f"{new}:4"),
        ("crm.update", f"{new}:6"),
    }
    # The workers that had finished never ran again: their artifacts came with them, and the summary read them.
    for key in finished:
        assert Task.objects.get(run=fork, key=key).attempts == 1
    summary = Artifact.objects.get(run=fork, task__key="summary").content["summary"]
    assert "worker-3: ticket opened, record updated, customer e-mail sent" in summary
    event = AuditEvent.objects.get(action="run_fork", outcome="done")
    assert event.run_id == run.id and event.detail["fork"] == fork.id
    assert Run.objects.get(id=run.id).status == Run.Status.NEEDS_ATTENTION  # the source is left as it was


def test_a_fork_from_the_crm_update_answers_it_with_its_receipt(failed):
    run, w3, step = failed
    preview = run_fork_preview(run_id=run.id, task_key="worker-3", step=6)
    assert [(c["step"], c["tool"]) for c in preview["new_calls"]] == [(8, "email.send")]
    update = next(e for e in preview["inherited_effects"] if e["task"] == "worker-3" and e["tool"] == "crm.update")
    assert update["answers_again"] and not update["replayed"]

    fork = stopped(run_fork(run_id=run.id, task_key="worker-3", step=6))
    assert fork.status == Run.Status.COMPLETED, fork.status_reason
    new = f"{run_key_prefix(fork.id)}worker-3"
    assert effects(idempotency_key__startswith=f"{new}:") == [("email.send", f"{new}:8:e1")]
    assert SandboxCall.objects.filter(is_effect=True, tool="crm.update").count() == 5


def test_another_failed_task_goes_on_from_its_last_step_in_the_fork(demo_tx, worker):
    both = {"faults": [{"task": key, "call": 4, "mode": "error"} for key in ("worker-2", "worker-3")]}
    run = stopped(run_start(workflow="incident-fanout", input=both))
    for _ in range(2):
        # On a busy machine one of the two failures can stop the run before a thread claims the other: the
        # operator's resume sends it, and it fails at its e-mail as the drill says.
        if not Task.objects.filter(run=run, key__in=["worker-2", "worker-3"], status=Task.Status.READY).exists():
            break
        run = stopped(run_resume(run_id=run.id))
    w2 = Task.objects.get(run=run, key="worker-2")
    assert (
        run.status == Run.Status.NEEDS_ATTENTION and w2.status == Task.Status.FAILED and journal(w2) == [*range(1, 8)]
    )
    Run.objects.filter(id=run.id).update(input={})

    preview = run_fork_preview(run_id=run.id, task_key="worker-3", step=8)
    assert {t["key"]: t["fate"] for t in preview["tasks"]}["worker-2"] == "continues"
    assert [
        (c["task"], c["step"], c["tool"]) for c in preview["new_calls"] if c["task"] in ("worker-2", "worker-3")
    ] == [
        ("worker-2", 8, "email.send"),
        ("worker-3", 8, "email.send"),
    ]
    fork = stopped(run_fork(run_id=run.id, task_key="worker-3", step=8))
    assert fork.status == Run.Status.COMPLETED, fork.status_reason
    f2 = Task.objects.get(run=fork, key="worker-2")
    assert f2.journal_epoch == 0 and journal(f2) == [*range(1, 10)]  # steps 1-7 replayed, the e-mail, the answer
    prefix = run_key_prefix(fork.id)
    # (A worker that had not finished when the run stopped goes on in the fork too: only these two are checked.)
    made = [
        (tool, key)
        for tool, key in effects(idempotency_key__startswith=prefix)
        if key.removeprefix(prefix).split(":")[0] in ("worker-2", "worker-3")
    ]
    assert made == [
        ("email.send", f"{prefix}worker-2:8"),  # the same key the source would have retried with, in the fork
        ("email.send", f"{prefix}worker-3:8:e1"),
    ]
    for tool in ("tickets.create", "crm.update", "email.send"):
        assert SandboxCall.objects.filter(is_effect=True, tool=tool).count() == 5, tool


def test_bad_forks_are_refused_and_change_nothing(failed):
    run, w3, step = failed
    runs = Run.objects.count()
    with pytest.raises(InvalidInput, match="run .* has no task 'worker-9'"):
        run_fork(run_id=run.id, task_key="worker-9", step=1)
    with pytest.raises(InvalidInput, match="a fork may start from step 1 to 8, not 9"):
        run_fork(run_id=run.id, task_key="worker-3", step=9)
    assert "not 0" in run_fork_preview(run_id=run.id, task_key="worker-3", step=0)["refusal"]
    with pytest.raises(Conflict, match="task plan is a planner's"):
        run_fork(run_id=run.id, task_key="plan", step=1)
    with pytest.raises(NotFound):
        run_fork_preview(run_id=run.id + 1000, task_key="worker-3", step=1)
    # Not settled, and not running either: a running run's ready task (one the stop left unclaimed) would
    # be claimed meanwhile by the test's worker threads, and the checks below would meet it running.
    Run.objects.filter(id=run.id).update(status=Run.Status.WAITING_FOR_APPROVAL)
    with pytest.raises(Conflict, match="fork a settled run"):
        run_fork(run_id=run.id, task_key="worker-3", step=step)
    Run.objects.filter(id=run.id).update(status=Run.Status.NEEDS_ATTENTION)
    email = ToolOperation.objects.get(task=w3, tool="email.send")
    ToolOperation.objects.filter(id=email.id).update(status=ToolOperation.Status.AMBIGUOUS)
    with pytest.raises(Conflict, match="resolve them before forking"):
        run_fork(run_id=run.id, task_key="worker-3", step=step, via="test")
    assert Run.objects.count() == runs
    assert AuditEvent.objects.filter(action="run_fork", outcome="denied").count() == 1


# --- the API ------------------------------------------------------------------------------------------------


def test_the_api_previews_and_forks_with_the_operate_permission(failed, operator, django_user_model, client):
    run, w3, step = failed
    token = api_token_create(user=operator)[1]
    viewer = django_user_model.objects.create_user(username="vic", password="vic-pass-123")
    membership_grant(user=viewer, project=default_project(), role="viewer")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    url = f"/api/v1/runs/{run.id}/fork-preview"

    preview = client.get(url, {"task": "worker-3", "step": step}, **auth)
    assert preview.status_code == 200, preview.content
    new_calls = [(c["task"], c["tool"]) for c in preview.json()["new_calls"] if c["task"] == "worker-3"]
    assert new_calls == [("worker-3", "email.send")] and preview.json()["refusal"] == ""
    assert client.get(url, {"task": "nope", "step": 1}, **auth).status_code == 422
    too_far = client.get(url, {"task": "worker-3", "step": 99}, **auth)
    assert too_far.status_code == 422 and "not 99" in too_far.json()["message"]
    viewing = {"HTTP_AUTHORIZATION": f"Bearer {api_token_create(user=viewer)[1]}"}
    assert client.get(url, {"task": "worker-3", "step": step}, **viewing).status_code == 403

    def fork(body, headers=auth):
        return client.post(
            f"/api/v1/runs/{run.id}/fork", data=json.dumps(body), content_type="application/json", **headers
        )

    runs = Run.objects.count()
    assert fork({"task": "worker-3", "step": step}, viewing).status_code == 403
    assert fork({"task": "nope", "step": 1}).status_code == 422
    assert fork({"task": "worker-3", "step": 99}).status_code == 422
    Run.objects.filter(id=run.id).update(status=Run.Status.WAITING_FOR_APPROVAL)  # not settled (nor running)
    assert fork({"task": "worker-3", "step": step}).status_code == 409
    Run.objects.filter(id=run.id).update(status=Run.Status.NEEDS_ATTENTION)
    assert Run.objects.count() == runs

    made = fork({"task": "worker-3", "step": step, "reason": "mail is back"})
    assert made.status_code == 201, made.content
    body = made.json()
    assert body["forked_from"] == {"run": run.id, "task": "worker-3", "step": step} and body["id"] != run.id
    assert stopped(Run.objects.get(id=body["id"])).status == Run.Status.COMPLETED
    event = AuditEvent.objects.get(action="run_fork", outcome="done")
    assert event.actor_id == operator.id and event.detail["reason"] == "mail is back"
    assert client.get(f"/api/v1/runs/{run.id}", **auth).json()["forked_from"] is None
