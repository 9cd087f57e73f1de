"""The ledger's pass of the recovery sweeper (registered in saga/apps.py): settle what an executor left,
wake an executor whose lease lapsed, and compensate the runs whose workflow says so after a failure."""

import logging

from django.db import transaction
from django.db.models import Exists, OuterRef, Q

from agents.models import Workflow
from core.errors import Conflict
from runs.models import Run, Task
from tools.models import ToolOperation

from .compensation import run_compensate, run_operations_send
from .executor import SUPERVISED, run_settle

log = logging.getLogger("warden.saga")
OS = ToolOperation.Status


def ledger_sweep(now) -> dict:
    """The ledger's pass of the recovery sweeper (registered in saga/apps.py)."""
    return {
        "operations_redriven": redrive_operations(now),
        "runs_settled": settle_stranded(now),
        "compensations_started": compensate_by_policy(now),
    }


def settle_stranded(now) -> int:
    """Sweeper step: a run whose executor made its last call and died (or lost the database) before it
    settled the run: nothing is left to call, so no message would come; settle it here."""
    open_statuses = [OS.PROPOSED, OS.AWAITING_APPROVAL, OS.APPROVED, OS.EXECUTING, OS.AMBIGUOUS]
    work = ToolOperation.objects.filter(run=OuterRef("pk"), status__in=open_statuses)
    stranded = (
        Run.objects.filter(status__in=[Run.Status.RUNNING, Run.Status.COMPENSATING])
        .filter(Q(ops_lease_expires_at__lt=now) | Q(ops_lease_expires_at__isnull=True))
        .filter(Exists(ToolOperation.objects.filter(run=OuterRef("pk")).filter(SUPERVISED)))
        .exclude(Exists(work.filter(SUPERVISED)))
        .exclude(Exists(Task.objects.filter(run=OuterRef("pk")).exclude(status__in=Task.TERMINAL)))  # at work
        .exclude(workflow__planner=Workflow.Planner.EXTERNAL)  # the agent's report settles those
        .values_list("id", flat=True)
    )
    # Under each run's lock; nothing moves while tasks are open or corrections wait.
    return sum(run_settle(run_id) for run_id in stranded)


def runs_owed_work(now):
    """The ids of the runs whose executor owes approved supervisor work and whose lease lapsed. The
    statuses are those of the partial index tooloperation_owed (tools/models.py): the sweep reads it."""
    return (
        ToolOperation.objects.filter(status__in=[OS.APPROVED, OS.EXECUTING, OS.AMBIGUOUS])
        .filter(SUPERVISED)
        .filter(run__status__in=[Run.Status.RUNNING, Run.Status.COMPENSATING])
        .exclude(run__workflow__planner=Workflow.Planner.EXTERNAL)  # nothing there for a worker to do
        .filter(Q(run__ops_lease_expires_at__lt=now) | Q(run__ops_lease_expires_at__isnull=True))
        .values_list("run_id", flat=True)
        .distinct()
    )


def redrive_operations(now) -> int:
    """Sweeper step: runs with approved supervisor work whose executor lease lapsed (a lost message or a
    dead worker) get a fresh message."""
    sent = 0
    for run_id in runs_owed_work(now):
        with transaction.atomic():
            run = Run.objects.select_for_update().get(id=run_id)
            expires = run.ops_lease_expires_at
            if expires is not None and expires >= now:
                continue
            Run.objects.filter(id=run_id).update(ops_lease_owner="")
            run_operations_send(run)
            sent += 1
    return sent


def compensate_by_policy(now) -> int:
    """Sweeper step: a run whose workflow compensates on failure (as the version the run started with
    says: run_workflow_settings), once no attempt is in flight."""
    pinned = Q(workflow_version__config__compensate_on_failure=True)
    unpinned = Q(workflow_version__isnull=True, workflow__compensate_on_failure=True)  # rows made around run_start
    candidates = Run.objects.filter(pinned | unpinned, status=Run.Status.NEEDS_ATTENTION).exclude(
        tasks__status=Task.Status.RUNNING
    )
    started = 0
    for run in candidates.filter(tasks__status=Task.Status.FAILED).distinct():
        if ToolOperation.objects.filter(run=run, status=OS.COMPENSATION_FAILED).exists():
            continue  # a compensation failed already: a human decides what next
        try:
            run_compensate(run_id=run.id, reason="compensating by the workflow's policy after a failure")
            started += 1
        except Conflict as exc:
            log.info("run %s: not compensated by policy yet: %s", run.id, exc)
    return started
