"""Reserving an attempt: a lease with a fencing token incremented on every claim.

Every later write of the attempt is a compare-and-set on that token, so a worker whose lease was
taken over can change nothing. Lock order is always the run row, then task rows.
"""

import os
import socket
import threading
from functools import cache

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core import bus, metrics
from core.errors import BudgetExceeded
from core.faults import faults

from ..models import Run, Span, Task
from ..transitions import TASK
from . import hot, sql
from .failure import fail_task
from .hot import Lease, Usage
from .runs import run_transition

CRASH = "crash"


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def claim_candidate(run_id: int, row) -> Task:
    """The few fields ``claim`` needs, from a row (id, status, key, fencing_token, attempts, continuing, agent_id)."""
    task_id, status, key, token, attempts, continuing, agent_id = row
    return Task(
        id=task_id,
        run_id=run_id,
        status=status,
        key=key,
        fencing_token=token,
        attempts=attempts,
        continuing=bool(continuing),
        agent_id=agent_id,
    )


def lease_expiry(now):
    return now + timezone.timedelta(seconds=settings.WARDEN["LEASE_SECONDS"])


def claim(task: Task, *, owner: str, now) -> Lease | None:
    """Move a claimable task to running under a new fencing token. Call with the run row locked.
    ``task`` needs id, run_id, key, agent_id, status, fencing_token, attempts and continuing."""
    continuing = bool(task.continuing)
    attempt = task.attempts if continuing else task.attempts + 1
    token = task.fencing_token + 1
    if attempt == 1 and not continuing:  # a first claim: one statement on PostgreSQL (runs/services/hot.py)
        claimed = hot.claim_fresh(task, owner=owner, now=now, token=token, expires=lease_expiry(now))
        if claimed is None:
            return None
        return Lease(
            task_id=task.id,
            run_id=task.run_id,
            token=token,
            attempt=1,
            span_id=claimed.span_id,
            owner=owner,
            task_span_id=claimed.task_span_id,
            fresh=True,
            context=claimed.context,
        )
    return _claim_again(task, owner=owner, now=now, attempt=attempt, token=token, continuing=continuing)


def _claim_again(task: Task, *, owner: str, now, attempt: int, token: int, continuing: bool) -> Lease | None:
    """A retry, a reclaim after a lost lease, or a continuation after a yield: the attempt span is new
    (or, continuing, the same one again)."""
    running = TASK.edge(task.status, Task.Status.RUNNING)  # ready, waiting to retry, or its lease expired
    claimed = sql.execute(
        "UPDATE runs_task SET status = %s, attempts = %s, fencing_token = %s, lease_owner = %s, "
        "lease_expires_at = %s, heartbeat_at = %s, continuing = %s, started_at = COALESCE(started_at, %s), "
        "not_before = NULL WHERE id = %s AND fencing_token = %s AND status = %s",
        [
            running,
            attempt,
            token,
            owner,
            sql.ts(lease_expiry(now)),
            sql.ts(now),
            False,
            sql.ts(now),
            task.id,
            task.fencing_token,
            task.status,
        ],
    )
    if claimed != 1:
        return None
    task_span_id = (
        sql.fetchone(
            "SELECT id FROM runs_span WHERE task_id = %s AND kind = %s ORDER BY id LIMIT 1", [task.id, Span.Kind.TASK]
        )
        or [None]
    )[0]
    if continuing:
        span_id = sql.fetchone(
            "SELECT id FROM runs_span WHERE task_id = %s AND kind = %s AND attempt = %s ORDER BY id DESC LIMIT 1",
            [task.id, Span.Kind.ATTEMPT, attempt],
        )[0]
    else:
        span_id = sql.insert_span(
            run_id=task.run_id,
            task_id=task.id,
            parent_id=task_span_id,
            kind=Span.Kind.ATTEMPT,
            name=f"attempt {attempt}",
            status=Span.Status.RUNNING,
            attempt=attempt,
            fencing_token=token,
            started_at=now,
            attributes={"worker": owner},
        )
    return Lease(
        task_id=task.id,
        run_id=task.run_id,
        token=token,
        attempt=attempt,
        span_id=span_id,
        owner=owner,
        task_span_id=task_span_id,
        fresh=False,
    )


def _run_problem(code_version: str, overdue: bool) -> str:
    """Why the run stops for a person before this task starts ("" when nothing is wrong)."""
    if code_version != settings.WARDEN["CODE_VERSION"]:
        return (
            f"code version changed from {code_version} to {settings.WARDEN['CODE_VERSION']}; "
            "resume to continue under it"
        )
    return "run budget exceeded: deadline" if overdue else ""


def _held_back(run_id: int, task_id: int, max_concurrent: int | None, now) -> bool:
    """True when the run already runs as many tasks as it may: the task stays ready and the next sibling
    to finish (or the sweeper) sends it again. Counted after the lock, in a statement of its own, so it
    sees siblings claimed meanwhile."""
    running = sql.fetchone(
        "SELECT COUNT(*) FROM runs_task WHERE run_id = %s AND status = %s AND id <> %s",
        [run_id, Task.Status.RUNNING, task_id],
    )[0]
    if running < (max_concurrent or settings.WARDEN["MAX_CONCURRENT_TASKS_PER_RUN"]):
        return False
    sql.execute(
        "UPDATE runs_task SET ready_at = %s WHERE id = %s AND status = %s", [sql.ts(now), task_id, Task.Status.READY]
    )
    sql.execute("UPDATE runs_run SET held_back = held_back + 1 WHERE id = %s", [run_id])
    return True


def _fail(run_id: int, task_id: int, *, failure_class: str | None, reason: str, now) -> None:
    """The task fails before an attempt starts (no budget or no attempts left); None: nothing to run."""
    task = Task.objects.get(id=task_id)
    failure_class = failure_class or task.failure_class or "permanent"
    fail_task(task=task, run=Run.objects.get(id=run_id), failure_class=failure_class, reason=reason, now=now)
    return None


@cache
def _max_concurrent() -> str:
    """The workflow's concurrency cap as the version the run started with says (runs/selectors.py)."""
    return sql.pinned("wv.config", "max_concurrent_tasks", "w.max_concurrent_tasks", as_int=True)


def task_reserve(*, run_id: int, task_id: int, owner: str):
    """Reserve an attempt: lease, fencing token, attempt number and budget check, in one transaction.

    Returns a Lease, None when there is nothing to do (a duplicate or stale message), or CRASH when a
    drill fault says this worker dies before starting the task.
    """
    now = timezone.now()
    with transaction.atomic():
        # The run (locked: the run lock orders all writers of a run) and the task, in one round trip.
        row = sql.fetchone(
            "SELECT r.status, r.code_version, (r.deadline IS NOT NULL AND r.deadline < %s), r.steps_used, "
            "r.tokens_used, r.tool_calls_used, r.cost_micros, r.max_steps, r.max_tokens, r.max_tool_calls, "
            "r.max_cost_micros, r.input, " + _max_concurrent() + ", "
            "t.status, t.fencing_token, t.attempts, t.max_attempts, t.recoveries, t.continuing, t.key, t.agent_id, "
            "(t.status = %s AND t.lease_expires_at < %s), (t.not_before IS NULL OR t.not_before <= %s) "
            "FROM runs_run r JOIN agents_workflow w ON w.id = r.workflow_id JOIN runs_task t ON t.run_id = r.id "
            "LEFT JOIN agents_workflowversion wv ON wv.id = r.workflow_version_id "
            "WHERE r.id = %s AND t.id = %s" + sql.for_update("r"),
            [sql.ts(now), Task.Status.RUNNING, sql.ts(now), sql.ts(now), run_id, task_id],
        )
        if row is None:
            return None
        status, code_version, overdue, *usage = row[:11]
        run_input, max_concurrent = row[11:13]
        t_status, token, attempts, max_attempts, recoveries, continuing, key, agent_id, expired, due = row[13:]
        claimable = (
            t_status == Task.Status.READY
            or (t_status == Task.Status.RETRY_WAIT and due)
            or (t_status == Task.Status.RUNNING and expired)
        )
        if not claimable or status != Run.Status.RUNNING:
            return None  # a duplicate or stale message; a paused run is re-driven by its resume
        problem = _run_problem(code_version, overdue)
        if problem:
            run_transition(run=Run.objects.get(id=run_id), to=Run.Status.NEEDS_ATTENTION, reason=problem, now=now)
            return None
        try:
            Usage(status, *usage).check_before_step("run")
        except BudgetExceeded as exc:
            return _fail(run_id, task_id, failure_class=exc.failure_class, reason=str(exc), now=now)
        if _held_back(run_id, task_id, max_concurrent, now):
            return None
        task = claim_candidate(run_id, (task_id, t_status, key, token, attempts, continuing, agent_id))
        if t_status == Task.Status.RUNNING:
            record_lease_expiry(task=Task.objects.get(id=task_id), now=now)
            recoveries += 1
        if not continuing and attempts >= max_attempts + recoveries:
            return _fail(run_id, task_id, failure_class=None, reason=f"no attempts left ({attempts} made)", now=now)
        if faults.start_crash_due(sql.loads(run_input), run_id=run_id, task_key=key):
            return CRASH
        return claim(task, owner=owner, now=now)


def record_lease_expiry(*, task: Task, now) -> None:
    """The trace's record that a worker lost this task's lease. Call with the task locked."""
    transaction.on_commit(metrics.LEASE_EXPIRIES.inc)  # counted once the recovery is
    Task.objects.filter(id=task.id).update(recoveries=task.recoveries + 1)
    bus.run_changed(task.run_id)
    task.recoveries += 1
    Span.objects.filter(task=task, kind=Span.Kind.ATTEMPT, ended_at__isnull=True).update(
        ended_at=now, status=Span.Status.ERROR
    )
    Span.objects.create(
        run_id=task.run_id,
        task=task,
        kind=Span.Kind.RECOVERY,
        name=f"lease expired: {task.key}",
        parent_id=Span.objects.filter(task=task, kind=Span.Kind.TASK).values_list("id", flat=True).first(),
        started_at=now,
        ended_at=now,
        attributes={"previous_owner": task.lease_owner, "fencing_token": task.fencing_token, "attempt": task.attempts},
    )
