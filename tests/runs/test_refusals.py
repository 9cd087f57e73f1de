"""What the pages, the run page's buttons and the bulk preview offer is what the services do.

Every run action is driven, on runs in every state (with a failed, a running or a replaced task, with or
without an operation of unknown outcome), through each of its previews and through its service (in a
transaction rolled back afterwards). They must agree: a preview refuses exactly when the service does.
"""

import itertools

import pytest
from django.db import transaction

from core.errors import WardenError
from dashboard.bulk import bulk_apply, bulk_preview
from dashboard.views.run_actions import _cancel_preview, _compensate_preview, _resume_preview
from dashboard.views.run_page import header_context
from runs.models import Run, Task
from runs.services import run_cancel, run_resume, run_start, task_retry, task_retry_from, task_retry_preview
from runs.transitions import TransitionNotAllowed
from saga.compensation import operation_resolve, operation_resolve_refusal, run_compensate
from tools.installation import run_key_prefix
from tools.models import ToolOperation

TASKS = ["idle", "failed", "running", "replaced"]
OPERATIONS = [None, ToolOperation.Status.AMBIGUOUS, ToolOperation.Status.COMMITTED]


class _Rollback(Exception):
    pass


def refused(act) -> bool:
    """Whether the service refuses; what it did is rolled back either way."""
    try:
        with transaction.atomic():
            act()
            raise _Rollback
    except _Rollback:
        return False
    except (WardenError, TransitionNotAllowed):
        return True


def scene(status: str, tasks: str, operation: str | None) -> tuple[Run, Task, ToolOperation | None]:
    run = run_start(workflow="deploy-review")
    subject = run.tasks.order_by("id").first()
    if tasks == "failed":
        Task.objects.filter(id=subject.id).update(status=Task.Status.FAILED, attempts=1)
    elif tasks == "running":
        Task.objects.filter(id=subject.id).update(status=Task.Status.RUNNING, attempts=1)
    elif tasks == "replaced":  # failed under a plan a re-plan replaced
        Run.objects.filter(id=run.id).update(plan_version=2)
        Task.objects.filter(id=subject.id).update(status=Task.Status.FAILED, attempts=1, plan_version=1)
    Run.objects.filter(id=run.id).update(status=status)
    op = None
    if operation:
        op = ToolOperation.objects.create(
            gate="allow",
            run=run,
            task=subject,
            step=1,
            call_number=1,
            tool="tickets.create",
            idempotency_key=f"{run_key_prefix(run.id)}{subject.key}:1",
            arguments_hash="0" * 64,
            arguments={"customer_id": "c1", "title": "t"},
            tool_class="idempotent_write",
            reversibility="reversible",
            status=operation,
        )
    run.refresh_from_db()
    subject.refresh_from_db()
    return run, subject, op


SCENES = list(itertools.product(Run.Status.values, TASKS, OPERATIONS))


@pytest.mark.django_db
def test_every_preview_agrees_with_its_service(demo, operator):
    disagreements, counted = [], {}

    def agree(action: str, where: str, preview_refuses: bool, service_refuses: bool, what: str):
        counted[(action, service_refuses)] = counted.get((action, service_refuses), 0) + 1
        if preview_refuses != service_refuses:
            said = "refuses" if preview_refuses else "offers"
            did = "refuses" if service_refuses else "does"
            disagreements.append(f"{action} on {what}: {where} {said}, the service {did}")

    for status, tasks, operation in SCENES:
        run, task, op = scene(status, tasks, operation)
        what = f"a {status} run ({tasks} task, {operation or 'no'} operation)"
        header = header_context(run, run.created_at)

        # cancel: its page, the run page's button, the bulk preview
        service = refused(lambda run=run: run_cancel(run_id=run.id, reason="test"))
        agree("cancel", "the page", bool(_cancel_preview(run)["refusal"]), service, what)
        agree("cancel", "the button", not header["can_cancel"], service, what)
        agree("cancel", "bulk", run.id not in bulk_preview(user=operator, action="cancel", run_ids=[run.id]).eligible,
              service, what)  # fmt: skip

        # resume
        service = refused(lambda run=run: run_resume(run_id=run.id))
        agree("resume", "the page", bool(_resume_preview(run)["refusal"]), service, what)
        agree("resume", "the button", not header["can_resume"], service, what)

        # compensate
        service = refused(lambda run=run: run_compensate(run_id=run.id, reason="test"))
        agree("compensate", "the page", bool(_compensate_preview(run)["refusal"]), service, what)
        agree("compensate", "the button", not header["can_compensate"], service, what)
        eligible = bulk_preview(user=operator, action="compensate", run_ids=[run.id]).eligible
        agree("compensate", "bulk", run.id not in eligible, service, what)

        # retry a task, plainly and from step 1; the bulk "retry failed tasks"
        service = refused(lambda task=task: task_retry(task_id=task.id))
        agree("retry", "the page", bool(task_retry_preview(task_id=task.id)["refusal"]), service, what)
        service = refused(lambda task=task: task_retry_from(task_id=task.id, step=1))
        agree("retry from step 1", "the page", bool(task_retry_preview(task_id=task.id, step=1)["refusal"]), service,
              what)  # fmt: skip
        eligible = bulk_preview(user=operator, action="retry", run_ids=[run.id]).eligible
        service = refused(
            lambda run=run: _raise_unless_done(bulk_apply(user=operator, action="retry", run_ids=[run.id], reason="t"))
        )
        agree("retry failed tasks", "bulk", run.id not in eligible, service, what)

        # resolve an operation of unknown outcome
        if op is not None:
            service = refused(lambda op=op: operation_resolve(operation_id=op.id, committed=True, note="checked"))
            agree("resolve", "the page", operation_resolve_refusal(op) is not None, service, what)

    assert not disagreements, "\n".join(disagreements)
    # Each action was both offered and refused somewhere (the scenes cover both sides of each rule).
    actions = {action for action, _ in counted}
    assert all((action, True) in counted and (action, False) in counted for action in actions), counted


def _raise_unless_done(outcomes):
    [outcome] = outcomes
    if outcome.result != "done":
        raise WardenError(outcome.message)
