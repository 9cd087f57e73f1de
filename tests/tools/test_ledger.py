"""The broker and the ledger end to end, with worker threads in this process (embedded mode runs
exactly this way; the scaled suite runs it again on PostgreSQL and Redis)."""

import pytest

from core.errors import Conflict
from policy.models import ApprovalRequest
from runs.models import Run, Task
from runs.services import run_cancel, run_start
from saga.compensation import compensation_plan, run_compensate
from tests.conftest import decide
from tests.runs.test_engine import finished, scripted_workflow
from tools.installation import run_key_prefix
from tools.models import SandboxCall, SandboxEmail, SandboxRecord, SandboxTicket, ToolOperation

OS = ToolOperation.Status


def effects(system=None, key_contains=None):
    rows = SandboxCall.objects.filter(is_effect=True)
    if system:
        rows = rows.filter(system=system)
    if key_contains:
        rows = rows.filter(idempotency_key__contains=key_contains)
    return rows


def ops(run, **filters):
    return ToolOperation.objects.filter(run=run, **filters)


def fault(mode, call=4, task="worker-3", **extra):
    return {"faults": [{"task": task, "call": call, "mode": mode, **extra}]}


def stopped(run, statuses, timeout=30):
    from tests.conftest import wait_for

    wait_for(lambda: Run.objects.get(id=run.id).status in statuses, timeout=timeout, message=f"run {run.id} {statuses}")
    run.refresh_from_db()
    return run


def idle(run):
    from tests.conftest import wait_for

    wait_for(lambda: not run.tasks.filter(status=Task.Status.RUNNING).exists(), message="attempts in flight to end")


# --- B1: resume ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["transient", "timeout_after_commit"])
def test_b1_the_fourth_call_is_repeated_with_the_same_key_and_nothing_else_runs_again(demo_tx, worker, mode):
    run = finished(run_start(workflow="incident-fanout", input=fault(mode)))
    assert run.status == Run.Status.COMPLETED, run.status_reason
    w3 = Task.objects.get(run=run, key="worker-3")
    # one effect per key in every system; five of each kind
    for system, count in {"tickets": 5, "crm": 5, "email": 5}.items():
        rows = effects(system, key_contains=run_key_prefix(run.id))
        assert rows.count() == count, (system, list(rows.values_list("idempotency_key", flat=True)))
        assert len(set(rows.values_list("idempotency_key", flat=True))) == count
    email = ops(run, task=w3, tool="email.send").get()
    assert email.status == OS.COMMITTED
    assert SandboxEmail.objects.filter(idempotency_key=email.idempotency_key).count() == 1
    if mode == "transient":
        assert w3.attempts == 2 and email.attempts == 2  # the retry called again, with the same key
        # calls 1-3 were replayed from the journal: each system served worker-3 once per call
        served = SandboxCall.objects.filter(idempotency_key__startswith=f"{run_key_prefix(run.id)}worker-3:")
        assert sorted(served.values_list("tool", flat=True)) == sorted(
            ["crm.read", "tickets.create", "crm.update", "email.send"]
        )
    else:
        assert email.status_reason == "reconciled: committed" and email.attempts == 1
        assert w3.attempts == 1  # reconciled in the same attempt: no retry was needed


# --- B2: compensate ------------------------------------------------------------------------------------


def test_b2_compensation_closes_tickets_restores_records_and_corrects_emails_after_approval(demo_tx, worker, operator):
    run = finished(run_start(workflow="incident-fanout", input=fault("error")))
    assert run.status == Run.Status.NEEDS_ATTENTION
    assert "worker-3" in run.status_reason
    idle(run)  # attempts in flight finish
    tickets = set(
        SandboxTicket.objects.filter(idempotency_key__startswith=run_key_prefix(run.id)).values_list("id", flat=True)
    )
    # a worker that had not started when worker-3 failed is held: the run starts nothing new
    assert 1 <= len(tickets) <= 5 and SandboxTicket.objects.filter(idempotency_key__contains=":worker-3:").exists()
    sent_before = SandboxEmail.objects.count()
    assert not SandboxEmail.objects.filter(idempotency_key__contains=":worker-3:").exists()

    plan = compensation_plan(run.id)
    assert len(plan["undo"]) == 2 * len(tickets) and len(plan["correct"]) == sent_before
    committed = [p["committed_at"] for p in plan["undo"]]
    assert committed == sorted(committed, reverse=True)  # reverse commit order
    run_compensate(run_id=run.id)
    run = stopped(run, {Run.Status.COMPENSATING}, timeout=5)
    from tests.conftest import wait_for

    wait_for(lambda: not ops(run, status=OS.APPROVED).exists() and not ops(run, status=OS.EXECUTING).exists())
    # every ticket closed, every record back to its before-image, no e-mail sent without approval
    assert set(SandboxTicket.objects.filter(id__in=tickets).values_list("status", flat=True)) == {"closed"}
    for record in SandboxRecord.objects.filter(customer_id__startswith="cust-worker-"):
        assert record.fields == {"status": "active"}, record.fields
    assert SandboxEmail.objects.count() == sent_before
    run.refresh_from_db()
    assert run.status == Run.Status.COMPENSATING  # the corrections wait for a reviewer

    corrections = ApprovalRequest.objects.get(run=run, kind=ApprovalRequest.Kind.CORRECTION)
    decide(request_id=corrections.id, user=operator, approve=True)
    run = stopped(run, {Run.Status.COMPENSATED})
    assert SandboxEmail.objects.filter(kind="correction").count() == sent_before
    assert set(ops(run, kind="action").exclude(tool_class="read_only").values_list("status", flat=True)) == {
        OS.COMPENSATED
    } | ({OS.FAILED} if ops(run, status=OS.FAILED).exists() else set())
    # compensations undid in reverse commit order
    undo = list(ops(run, kind="compensation").order_by("order"))
    assert [u.compensates.committed_at for u in undo] == sorted(
        (u.compensates.committed_at for u in undo), reverse=True
    )
    # each compensation reached its system once
    for u in ops(run).exclude(kind="action"):
        assert effects(key_contains=u.idempotency_key).count() <= 1


def test_a_cancel_does_not_interrupt_a_compensation(demo_tx, worker, operator):
    run = finished(run_start(workflow="incident-fanout", input=fault("error", call=3)))
    idle(run)
    run_compensate(run_id=run.id)
    with pytest.raises(Conflict, match="it cannot be cancelled \\(being compensated\\)"):
        run_cancel(run_id=run.id)


# --- B3: propose, then approve once ---------------------------------------------------------------------


@pytest.mark.parametrize("approve", [True, False])
def test_b3_proposed_emails_are_sent_once_each_after_one_approval_and_never_after_a_rejection(
    demo_tx, worker, operator, approve
):
    run = stopped(
        run_start(workflow="incident-fanout", input={"propose_tools": ["email.send"]}),
        {Run.Status.WAITING_FOR_APPROVAL, Run.Status.COMPLETED, Run.Status.NEEDS_ATTENTION},
    )
    assert run.status == Run.Status.WAITING_FOR_APPROVAL, run.status_reason
    assert not effects("email").exists()  # workers proposed; nothing was sent
    assert effects("tickets").count() == 5  # reversible work ran early
    bundle = ApprovalRequest.objects.get(run=run, parent=None)
    assert bundle.kind == ApprovalRequest.Kind.BUNDLE and bundle.items.count() == 5
    assert ToolOperation.objects.filter(approval__parent=bundle, tool="email.send").count() == 5
    assert set(Task.objects.filter(run=run).values_list("status", flat=True)) == {Task.Status.COMPLETED}

    decide(request_id=bundle.id, user=operator, approve=approve, note="" if approve else "not today")
    run = stopped(run, {Run.Status.COMPLETED, Run.Status.NEEDS_ATTENTION})
    assert run.status == Run.Status.COMPLETED, run.status_reason
    if approve:
        assert effects("email").count() == 5
        keys = list(effects("email").values_list("idempotency_key", flat=True))
        assert len(set(keys)) == 5
        assert set(ops(run, tool="email.send").values_list("status", flat=True)) == {OS.COMMITTED}
    else:
        assert not effects("email").exists()
        assert set(ops(run, tool="email.send").values_list("status", flat=True)) == {OS.REJECTED}


# --- refusals ------------------------------------------------------------------------------------------


def test_a_call_outside_the_allowlist_or_with_bad_arguments_calls_nothing_and_the_model_gets_a_structured_error(
    demo_tx, worker
):
    from runs.models import Span

    wf = scripted_workflow(
        "refusals",
        [
            {"tool": "email.send", "arguments": {"to": "a@b.c", "subject": "s", "body": "b"}},
            {"tool": "tickets.create", "arguments": {"customer_id": "bad id!", "title": ""}},
            {"tool": "tickets.close", "arguments": {"ticket_id": "T-1"}},
            {"final": {"done": "after three refusals"}},
        ],
        tools=["tickets.create"],
    )
    run = finished(run_start(workflow=wf.slug))
    assert run.status == Run.Status.COMPLETED, run.status_reason
    assert not SandboxCall.objects.exists() and not ToolOperation.objects.exists()
    bodies = [s.body for s in Span.objects.filter(run=run, kind="tool_call").order_by("step")]
    assert [b["error"]["code"] for b in bodies] == ["not_allowed", "invalid_arguments", "unknown_tool"]
    fields = {f["field"] for f in bodies[1]["error"]["fields"]}
    assert fields == {"customer_id", "title"}


def test_a_workflow_policy_makes_a_call_wait_for_a_reviewer(demo_tx, worker, operator):
    from tests.conftest import wait_for

    script = [
        {"tool": "tickets.create", "arguments": {"customer_id": "c-{task}", "title": "t"}},
        {"tool": "email.send", "arguments": {"to": "{task}@x.example", "subject": "s", "body": "b"}},
        {"final": {"outcome": "{last}"}},
    ]
    wf = scripted_workflow("gated", script, tools=["tickets.create", "email.send"])
    wf.tasks = [{"key": f"w{n}", "agent": "gated-agent", "objective": "Do it"} for n in range(3)]
    wf.tool_policies = {"email.send": {"approval": "always"}}
    wf.save()
    run = stopped(run_start(workflow=wf.slug), {Run.Status.WAITING_FOR_APPROVAL})
    wait_for(lambda: ApprovalRequest.objects.filter(run=run, status="pending").count() == 3)
    assert effects("tickets").count() == 3 and not effects("email").exists()
    assert Task.objects.filter(run=run, status=Task.Status.WAITING_FOR_APPROVAL).count() == 3
    assert set(ops(run, tool="email.send").values_list("status", flat=True)) == {OS.AWAITING_APPROVAL}
    requests = list(ApprovalRequest.objects.filter(run=run).order_by("id"))
    for n, request in enumerate(requests):
        decide(request_id=request.id, user=operator, approve=n != 0, note="not this one" if n == 0 else "")
    run = finished(run)
    assert run.status == Run.Status.COMPLETED, run.status_reason
    assert effects("email").count() == 2
    rejected = ops(run, tool="email.send", status=OS.REJECTED).get()
    assert rejected.task_id == requests[0].task_id
    # the model saw the rejection as a structured error, and waiting was not a failed attempt
    task = Task.objects.get(id=rejected.task_id)
    assert task.attempts == 1
    from runs.models import Artifact

    assert "rejected" in Artifact.objects.get(task=task).content["outcome"]


def test_the_admin_shows_what_compensation_will_do_before_it_starts(demo_tx, worker, client, django_user_model):
    from django.urls import reverse

    root = django_user_model.objects.create_superuser(username="root", password="root-pass-123", email="r@x.y")
    client.force_login(root)
    run = finished(run_start(workflow="incident-fanout", input=fault("error", call=3)))
    idle(run)
    url = reverse("admin:runs_run_changelist")
    page = client.post(url, {"action": "compensate_runs", "_selected_action": [run.id]})
    text = page.content.decode()
    ticket = SandboxTicket.objects.filter(idempotency_key__contains=":worker-3:").get()
    assert "Yes, compensate" in text and ticket.ticket_id in text and "undone by tickets.close" in text
    assert Run.objects.get(id=run.id).status == Run.Status.NEEDS_ATTENTION  # nothing changed yet
    client.post(url, {"action": "compensate_runs", "_selected_action": [run.id], "confirm": "yes"})
    from tests.conftest import wait_for

    wait_for(lambda: SandboxTicket.objects.get(id=ticket.id).status == "closed", message="the ticket to close")
    assert Run.objects.get(id=run.id).status in (Run.Status.COMPENSATING, Run.Status.COMPENSATED)
    # the run's page shows its ledger
    page = client.get(reverse("admin:runs_run_change", args=[run.id])).content.decode()
    assert "compensated" in page and "tickets.create" in page


def test_cancelling_a_run_that_waits_for_approval_withdraws_the_request_and_sends_nothing(demo_tx, worker, operator):
    run = stopped(
        run_start(workflow="incident-fanout", input={"propose_tools": ["email.send"]}), {"waiting_for_approval"}
    )
    run_cancel(run_id=run.id)
    run = stopped(run, {Run.Status.CANCELLED})
    request = ApprovalRequest.objects.get(run=run, parent=None)
    assert request.status == ApprovalRequest.Status.WITHDRAWN
    assert set(ops(run, tool="email.send").values_list("status", flat=True)) == {OS.REJECTED}
    with pytest.raises(Exception, match="withdrawn"):
        decide(request_id=request.id, user=operator, approve=True)
    assert not effects("email").exists()


def test_an_ambiguous_write_resolved_by_an_operator_lets_the_retried_task_finish(demo_tx, worker, monkeypatch):
    import dataclasses

    from runs.services import task_retry
    from saga.compensation import operation_resolve
    from tools import registry

    spec = registry.TOOLS["email.send"]
    monkeypatch.setitem(registry.TOOLS, "email.send", dataclasses.replace(spec, lookup=None))
    run = finished(run_start(workflow="incident-fanout", input=fault("timeout_after_commit")))
    assert run.status == Run.Status.NEEDS_ATTENTION
    idle(run)
    op = ops(run, tool="email.send", status=OS.AMBIGUOUS).get()
    with pytest.raises(Exception, match="resolve them before compensating"):
        run_compensate(run_id=run.id)
    # the operator checked the mail server: the message went out
    operation_resolve(operation_id=op.id, committed=True, note="found in the mail log")
    task_retry(task_id=op.task_id)
    run = finished(run)
    assert run.status == Run.Status.COMPLETED, run.status_reason
    assert effects("email", key_contains=op.idempotency_key).count() == 1  # not sent again
    op.refresh_from_db()
    assert op.status == OS.COMMITTED and "found in the mail log" in op.status_reason


def test_a_workflow_can_let_corrections_go_without_a_reviewer(demo_tx, worker):
    script = [
        {"tool": "email.send", "arguments": {"to": "a@x.example", "subject": "s", "body": "b"}},
        {"tool": "tickets.create", "arguments": {"customer_id": "c1", "title": "t"}},
        {"final": {}},
    ]
    wf = scripted_workflow("mailer", script, tools=["email.send", "tickets.create"])
    wf.tool_policies = {"email.send": {"correction_approval": "never"}}
    wf.save()
    run = finished(run_start(workflow=wf.slug, input=fault("error", call=2, task="only")))
    assert run.status == Run.Status.NEEDS_ATTENTION and SandboxEmail.objects.count() == 1
    run_compensate(run_id=run.id)
    run = stopped(run, {Run.Status.COMPENSATED, Run.Status.NEEDS_ATTENTION})
    assert run.status == Run.Status.COMPENSATED, run.status_reason
    assert not ApprovalRequest.objects.filter(run=run).exists()
    (correction,) = SandboxEmail.objects.filter(kind="correction")
    assert correction.in_reply_to == SandboxEmail.objects.get(kind="message").message_id
    assert ops(run, kind="correction").get().status == OS.COMMITTED


def test_proposals_of_a_run_that_ends_over_budget_are_recorded_as_not_executed(demo_tx, worker, settings):
    from runs.models import Span

    # A hold that undercounts prompts (a tokenizer denser than WARDEN_PROMPT_CHARS_PER_TOKEN says), so
    # that a final answer can still cross the budget after the fact.
    settings.WARDEN = {**settings.WARDEN, "PROMPT_CHARS_PER_TOKEN": 10**6, "SCRIPTED_MAX_OUTPUT_TOKENS": 1}

    script = [
        {"tool": "email.send", "arguments": {"to": "a@x.example", "subject": "s", "body": "b"}},
        {"final": {"done": "{last[status]}"}},
    ]
    wf = scripted_workflow("proposer", script, tools=["email.send"])
    probe = finished(run_start(workflow=wf.slug, input={"propose_tools": ["email.send"]}))
    assert probe.status == Run.Status.WAITING_FOR_APPROVAL
    first_call = Span.objects.filter(run=probe, kind="model_call").order_by("step").first()
    # A token budget the first model call fits in and the final answer crosses: the answer is kept,
    # nothing more starts, so the supervisor never executes the proposal.
    budget = {"max_tokens": first_call.tokens_in + first_call.tokens_out + 2}  # the next hold: 1 + 1 token
    run = finished(run_start(workflow=wf.slug, input={"propose_tools": ["email.send"]}, budget=budget))
    assert run.status == Run.Status.COMPLETED and "1 proposals not executed" in run.status_reason
    op = ops(run, tool="email.send").get()
    assert op.status == OS.REJECTED and op.status_reason.startswith("not executed: run budget exceeded")
    assert not ApprovalRequest.objects.filter(run=run).exists() and not effects("email").exists()


def test_a_compensated_run_says_which_effects_still_stand(demo_tx, worker):
    from saga.compensation import operation_resolve

    script = [
        {"tool": "tickets.create", "arguments": {"customer_id": "c1", "title": "t"}},
        {"tool": "crm.update", "arguments": {"customer_id": "c1", "fields": {"status": "escalated"}}},
        {"final": {}},
    ]
    wf = scripted_workflow("ticket-then-crm", script, tools=["tickets.create", "crm.update"])
    run = finished(run_start(workflow=wf.slug, input=fault("timeout_no_lookup", call=2, task="only")))
    assert run.status == Run.Status.NEEDS_ATTENTION
    update = ops(run, tool="crm.update").get()
    # The operator found the change in the CRM; what it replaced is not known, so nothing can undo it.
    operation_resolve(operation_id=update.id, committed=True, note="seen in the CRM's history")
    assert [item["operation"] for item in compensation_plan(run.id)["cannot_undo"]] == [update.id]
    run_compensate(run_id=run.id)
    run = stopped(run, {Run.Status.COMPENSATED})
    assert SandboxTicket.objects.get(customer_id="c1").status == "closed"
    assert "1 effects undone or corrected" in run.status_reason
    assert f"1 still stand (not undone): operations {update.id} (crm.update)" in run.status_reason


def test_an_ambiguous_write_and_its_webhook_commit_together(demo_tx, worker, monkeypatch):
    """The operation.ambiguous webhook is written in the transaction that makes the operation ambiguous:
    a crash between the two can neither lose the event nor announce a status that was not written."""
    import dataclasses

    from django.db import connection

    from integrations import webhooks
    from tools import registry

    spec = registry.TOOLS["email.send"]
    monkeypatch.setitem(registry.TOOLS, "email.send", dataclasses.replace(spec, lookup=None))
    emit, seen = webhooks.webhook_emit, []

    def watched(**kwargs):
        if kwargs["event"] == "operation.ambiguous":
            status = ToolOperation.objects.get(id=kwargs["data"]["operation"]).status
            seen.append((connection.in_atomic_block, status))
        return emit(**kwargs)

    monkeypatch.setattr(webhooks, "webhook_emit", watched)
    run = finished(run_start(workflow="incident-fanout", input=fault("timeout_after_commit")))
    assert run.status == Run.Status.NEEDS_ATTENTION
    assert ops(run, status=OS.AMBIGUOUS).exists()
    assert seen == [(True, OS.AMBIGUOUS)]  # once, though reconciling found it ambiguous again


def test_a_run_whose_executor_died_before_settling_it_is_settled_by_the_sweeper(demo_tx, worker, operator):
    """The executor made the last proposal's call and lost the database (or died) before it settled the
    run: no message is left to come, so the sweeper settles it (seen in the PostgreSQL-restart drill)."""
    from django.utils import timezone

    from tests.conftest import wait_for

    run = stopped(
        run_start(workflow="incident-fanout", input={"propose_tools": ["email.send"]}), {"waiting_for_approval"}
    )
    decide(request_id=ApprovalRequest.objects.get(run=run, parent=None).id, user=operator, approve=True)
    assert finished(run).status == Run.Status.COMPLETED
    assert set(ops(run, tool="email.send").values_list("status", flat=True)) == {OS.COMMITTED}
    # What that executor leaves: every proposal sent, the run still running, its lease lapsed.
    lapsed = timezone.now() - timezone.timedelta(seconds=1)
    Run.objects.filter(id=run.id).update(status=Run.Status.RUNNING, ops_lease_owner="w:1", ops_lease_expires_at=lapsed)
    wait_for(lambda: Run.objects.get(id=run.id).status == Run.Status.COMPLETED, message="the sweeper to settle it")
    assert effects("email", key_contains=run_key_prefix(run.id)).count() == 5  # settling sent nothing again


@pytest.mark.services
def test_the_sagas_sweep_reads_the_owed_operations_through_their_partial_index(demo):
    """The sweep runs several times a second over a ledger of millions of finished calls: the few an
    executor may still owe are read from the partial index tooloperation_owed, and found."""
    from django.db import connection, transaction
    from django.utils import timezone

    from saga.sweeps import runs_owed_work

    run = run_start(workflow="deploy-review")
    done = dict(gate="allow", run=run, tool="email.send", arguments_hash="h", proposed=True, tool_class="read_only")
    ToolOperation.objects.create(**done, idempotency_key=f"{run_key_prefix(run.id)}x:1", status="committed")
    ToolOperation.objects.create(**done, idempotency_key=f"{run_key_prefix(run.id)}x:2", status="approved")
    owed = runs_owed_work(timezone.now())

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a test's ledger is too small to need an index
        plan = owed.explain()
    assert "tooloperation_owed" in plan, plan
    assert list(owed) == [run.id]
