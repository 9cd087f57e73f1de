"""Retrying a failed task from step N of its journal (runs/services/retry.py), on drill B's incident-fanout:
worker-3's e-mail fails for good at its fourth call, after its ticket and its CRM update. Effects are counted
in the sandbox systems, from outside the engine."""

import json

import pytest

from core.errors import Conflict, InvalidInput
from policy.models import ApprovalRequest
from runs.models import Run, Span, Task
from runs.services import run_start, task_retry, task_retry_from, task_retry_from_preview, task_retry_preview
from saga.compensation import operation_resolve
from tenancy.access import default_project, membership_grant
from tenancy.models import AuditEvent
from tenancy.tokens import api_token_create
from tests.conftest import decide, wait_for
from tools.installation import run_key_prefix
from tools.models import SandboxCall, SealedArguments, ToolOperation

EMAIL_FAILS = {"faults": [{"task": "worker-3", "call": 4, "mode": "error"}]}


def stopped(run, statuses=(Run.Status.COMPLETED, Run.Status.NEEDS_ATTENTION, Run.Status.FAILED)) -> Run:
    wait_for(lambda: Run.objects.get(id=run.id).status in statuses, message=f"run {run.id} to stop")
    wait_for(lambda: not run.tasks.filter(status=Task.Status.RUNNING).exists(), message="attempts in flight to end")
    run.refresh_from_db()
    return run


def repair_the_email_service(run) -> None:
    """The drill's `error` fault fires on every call; an operator retries once the system is fixed."""
    Run.objects.filter(id=run.id).update(input={k: v for k, v in run.input.items() if k != "faults"})


def effects(run, task_key="worker-3") -> list[tuple[str, str]]:
    calls = SandboxCall.objects.filter(
        idempotency_key__startswith=f"{run_key_prefix(run.id)}{task_key}:", is_effect=True
    )
    return sorted(calls.values_list("tool", "idempotency_key"))


def journal_steps(task) -> list[int]:
    return list(Span.objects.filter(task=task, step__isnull=False).order_by("step").values_list("step", flat=True))


@pytest.fixture
def failed(demo_tx, worker):
    """Run, worker-3 (failed after journaling steps 1-7: read, ticket, CRM update, and the model's ask for
    the e-mail) and the step of its crm.update call."""

    def start(input=EMAIL_FAILS):
        run = stopped(run_start(workflow="incident-fanout", input=input))
        assert run.status == Run.Status.NEEDS_ATTENTION and "worker-3" in run.status_reason, run.status_reason
        w3 = Task.objects.get(run=run, key="worker-3")
        assert w3.status == Task.Status.FAILED and journal_steps(w3) == list(range(1, 8))
        return run, w3, ToolOperation.objects.get(task=w3, tool="crm.update").step

    return start


@pytest.mark.parametrize("where", ["the crm.update call", "the model step that asked for it"])
def test_retry_from_the_crm_update_reuses_its_receipt_and_replays_the_ticket(failed, where):
    run, w3, update_step = failed()
    n = update_step if where == "the crm.update call" else update_step - 1
    k = f"{run_key_prefix(run.id)}worker-3"

    preview = task_retry_from_preview(task_id=w3.id, step=n)
    assert preview["refusal"] == "" and preview["mode"] == "retry_from" and preview["last_step"] == 7
    assert [s["step"] for s in preview["re_executed"]] == list(range(n, 8))
    ops = {op["tool"]: op for op in preview["operations"]}
    assert list(ops) == ["crm.update", "email.send"]
    update, email = ops["crm.update"], ops["email.send"]
    assert (update["status"], update["reversibility"], update["tool_class"]) == (
        "committed",
        "reversible",
        "idempotent_write",
    )
    assert update["committed_write"] and update["reused"] and update["repeatable"] and not update["repeated"]
    assert update["idempotency_key"] == f"{k}:{update_step}" and update["new_key"] == f"{k}:{update_step}:e1"
    assert "not repeated" in update["outcome"]
    assert email["status"] == "failed" and email["irreversible"] and not email["repeated"] and not email["reused"]
    assert preview["repeated_effects"] == [] and [op["tool"] for op in preview["reused_receipts"]] == ["crm.update"]
    assert journal_steps(w3) == list(range(1, 8)) and Task.objects.get(id=w3.id).journal_epoch == 0  # a preview

    SealedArguments.objects.create(task=w3, step=update_step, values={"api_key": "kept"})
    SealedArguments.objects.create(task=w3, step=update_step + 2, values={"api_key": "superseded"})
    repair_the_email_service(run)
    task_retry_from(task_id=w3.id, step=n, reason="the CRM update must be checked again")
    run = stopped(run)
    assert run.status == Run.Status.COMPLETED, run.status_reason

    assert effects(run) == [
        ("crm.update", f"{k}:{update_step}"),  # once: the receipt answered the step again
        ("email.send", f"{k}:{update_step + 2}:e1"),
        ("tickets.create", f"{k}:{update_step - 2}"),  # replayed from the journal: once
    ]
    w3.refresh_from_db()
    assert w3.journal_epoch == 1 and w3.status == Task.Status.COMPLETED
    assert journal_steps(w3) == list(range(1, 10))  # 1..n-1 replayed, n.. anew, then the final answer
    assert Span.objects.get(task=w3, step=update_step).body["result"] == (
        ToolOperation.objects.get(task=w3, tool="crm.update").result
    )
    superseded = Span.objects.filter(task=w3, attributes__superseded_by_retry_from=n)
    assert sorted((s.attributes["journal_step"], s.step, s.attempt) for s in superseded) == [
        (step, None, 1) for step in range(n, 8)
    ]
    if n < update_step:  # the model was asked again at step n
        assert Span.objects.get(task=w3, step=n).attempt == 2
    assert Span.objects.filter(task=w3, kind=Span.Kind.RECOVERY, name=f"retry from step {n}").exists()
    # Secrets sealed by superseded model steps (under the step after theirs) are gone; step n's stay when
    # step n-1, the response that asked for that call, is replayed.
    kept = [update_step] if n == update_step else []
    assert list(SealedArguments.objects.filter(task=w3).values_list("step", flat=True)) == kept
    updates = ToolOperation.objects.filter(task=w3, tool="crm.update").order_by("id")
    assert [(op.status, op.step) for op in updates] == [("committed", update_step)]


@pytest.fixture
def reviewer(django_user_model):
    user = django_user_model.objects.create_user(username="rita", password="rita-pass-123")
    membership_grant(user=user, project=default_project(), role="reviewer")
    return user


def test_a_repeat_chosen_per_effect_waits_for_its_own_approval_then_happens_once(failed, reviewer):
    run, w3, update_step = failed()
    k = f"{run_key_prefix(run.id)}worker-3"
    ticket_step = update_step - 2
    with pytest.raises(InvalidInput, match=f"steps {ticket_step} have no committed effect at or after"):
        task_retry_from(task_id=w3.id, step=update_step - 1, repeat=[ticket_step])
    preview = task_retry_from_preview(task_id=w3.id, step=update_step - 1, repeat=[update_step])
    assert [op["tool"] for op in preview["repeated_effects"]] == ["crm.update"] and preview["reused_receipts"] == []
    assert "once a reviewer approves" in preview["repeated_effects"][0]["outcome"]

    repair_the_email_service(run)
    task_retry_from(task_id=w3.id, step=update_step - 1, repeat=[update_step], reason="the CRM lost the update")
    wait_for(lambda: ApprovalRequest.objects.filter(run=run).exists(), message="the repeat's approval request")
    request = ApprovalRequest.objects.get(run=run)
    again = ToolOperation.objects.get(idempotency_key=f"{k}:{update_step}:e1")
    assert again.status == ToolOperation.Status.AWAITING_APPROVAL and request.id == again.approval_id
    assert any("repeats committed operation" in reason for reason in again.verdict["reasons"])
    stopped(run, (Run.Status.WAITING_FOR_APPROVAL,))
    assert effects(run) == [("crm.update", f"{k}:{update_step}"), ("tickets.create", f"{k}:{ticket_step}")]

    decide(request_id=request.id, user=reviewer, approve=True)
    run = stopped(run)
    assert run.status == Run.Status.COMPLETED, run.status_reason
    assert effects(run) == [
        ("crm.update", f"{k}:{update_step}"),
        ("crm.update", f"{k}:{update_step}:e1"),  # the chosen repeat, once approved: once
        ("email.send", f"{k}:{update_step + 2}:e1"),
        ("tickets.create", f"{k}:{ticket_step}"),
    ]


def test_a_plain_retry_keeps_the_keys_and_refusals_change_nothing(failed):
    run, w3, update_step = failed()
    k = f"{run_key_prefix(run.id)}worker-3"
    before = list(Span.objects.filter(task=w3).order_by("id").values_list("id", "step", "attributes"))

    with pytest.raises(InvalidInput, match="from step 1 to 8, not 9"):
        task_retry_from(task_id=w3.id, step=9)
    with pytest.raises(InvalidInput):
        task_retry_from(task_id=w3.id, step=0)
    assert "not 9" in task_retry_from_preview(task_id=w3.id, step=9)["refusal"]
    plan = Task.objects.get(run=run, key="plan")
    with pytest.raises(Conflict, match="task plan is completed; only a failed task"):
        task_retry_from(task_id=plan.id, step=1)
    email = ToolOperation.objects.get(task=w3, tool="email.send")
    ToolOperation.objects.filter(id=email.id).update(status=ToolOperation.Status.AMBIGUOUS)
    with pytest.raises(Conflict, match=f"operations {email.id} \\(email.send, ambiguous\\) may or may not"):
        task_retry_from(task_id=w3.id, step=update_step)
    assert Task.objects.get(id=w3.id).journal_epoch == 0 and Task.objects.get(id=w3.id).status == Task.Status.FAILED
    assert list(Span.objects.filter(task=w3).order_by("id").values_list("id", "step", "attributes")) == before
    assert Run.objects.get(id=run.id).status == Run.Status.NEEDS_ATTENTION
    operation_resolve(operation_id=email.id, committed=False, note="not in the sent folder")

    preview = task_retry_preview(task_id=w3.id)
    assert preview["mode"] == "retry" and preview["from_step"] == 8 and preview["re_executed"] == []
    (op,) = preview["operations"]
    assert op["tool"] == "email.send" and op["new_key"] == op["idempotency_key"] == f"{k}:8"
    assert op["outcome"] == "called again with the same key" and preview["repeated_effects"] == []

    repair_the_email_service(run)
    task_retry(task_id=w3.id)
    run = stopped(run)
    assert run.status == Run.Status.COMPLETED, run.status_reason
    assert effects(run) == [
        ("crm.update", f"{k}:6"),
        ("email.send", f"{k}:8"),
        ("tickets.create", f"{k}:4"),
    ]
    assert Task.objects.get(id=w3.id).journal_epoch == 0


def test_proposals_of_superseded_steps_are_withdrawn_so_the_bundle_holds_each_once(failed):
    run, w3, update_step = failed({**EMAIL_FAILS, "propose_tools": ["crm.update"]})
    old = ToolOperation.objects.get(task=w3, tool="crm.update")
    assert old.status == ToolOperation.Status.PROPOSED

    repair_the_email_service(run)
    task_retry_from(task_id=w3.id, step=update_step - 1)
    run = stopped(run, (Run.Status.WAITING_FOR_APPROVAL, Run.Status.NEEDS_ATTENTION, Run.Status.COMPLETED))
    assert run.status == Run.Status.WAITING_FOR_APPROVAL, run.status_reason
    old.refresh_from_db()
    assert old.status == ToolOperation.Status.REJECTED
    assert old.status_reason == f"not done: superseded by a retry from step {update_step - 1}"
    bundled = ToolOperation.objects.filter(run=run, status=ToolOperation.Status.AWAITING_APPROVAL)
    assert sorted(bundled.values_list("task__key", flat=True)) == [f"worker-{n}" for n in range(1, 6)]
    assert bundled.get(task=w3).idempotency_key == f"{run_key_prefix(run.id)}worker-3:{update_step}:e1"


def test_the_api_takes_the_effects_to_repeat_by_step(failed, operator, client):
    run, w3, update_step = failed()
    token = api_token_create(user=operator)[1]
    url = f"/api/v1/runs/{run.id}/tasks/worker-3/retry"

    def retry(body):
        return client.post(
            url, data=json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
        )

    assert retry({"repeat": [update_step]}).status_code == 422  # a plain retry repeats nothing
    stray = retry({"from_step": update_step, "repeat": [update_step - 2]})
    assert stray.status_code == 422 and "have no committed effect" in stray.json()["message"]
    assert Task.objects.get(id=w3.id).status == Task.Status.FAILED
    update = ToolOperation.objects.get(task=w3, tool="crm.update")
    assert retry({"from_step": update_step - 1, "repeat": [update_step]}).status_code == 200
    assert ToolOperation.objects.get(id=update.id).repeat_chosen
    assert AuditEvent.objects.get(action="task_retry_from", outcome="done").detail["repeated_operations"] == [update.id]
