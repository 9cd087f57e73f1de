"""How an attempt ends: completed (artifact, DAG advanced), retried, failed, cancelled, yielded, or
quarantined when it no longer holds its lease."""

import functools
import json
import logging
import random

import jsonschema
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core import bus, metrics
from core.errors import BudgetExceeded, LeaseLost, StepFailure, TransientFailure
from core.faults import faults

from ..models import QuarantinedResult, Run, Span, Task
from ..transitions import RUN, TASK
from . import hot, sql
from .failure import fail_task
from .leases import CRASH, Lease, claim, claim_candidate
from .outbox import outbox_add
from .plans import plan_held
from .proposals import PROPOSED, operation_awaits_decision, proposals_bundle_if_any, proposals_drop, proposals_probe
from .runs import EXECUTE, run_finish_cancel_if_idle, run_transition, tasks_create

log = logging.getLogger("warden.engine")


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str):
    schema = json.loads(schema_json)
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema)


def output_validate(output, schema: dict) -> None:
    try:
        _validator(json.dumps(schema or {}, sort_keys=True)).validate(output)
    except jsonschema.ValidationError as exc:
        raise StepFailure(
            f"output does not match the schema: {exc.message} at {list(exc.absolute_path)}", "validation"
        ) from exc


def quarantine(lease: Lease, task: Task, *, step: int | None, body, response=None) -> None:
    """Record, without applying, what a worker brought back after losing its lease. A model call it
    made was paid for: its tokens and cost count on the task and the run all the same."""
    if response is not None and (response.tokens_in or response.tokens_out or response.cost_micros):
        tokens = response.tokens_in + response.tokens_out
        for table, row_id in (("runs_task", lease.task_id), ("runs_run", lease.run_id)):
            sql.add_usage(table, row_id, steps=0, tokens=tokens, tool_calls=0, cost=response.cost_micros)
    current = Task.objects.select_related("run").get(id=lease.task_id)
    if current.run.status in (Run.Status.CANCELLING, Run.Status.CANCELLED):
        reason = QuarantinedResult.Reason.RUN_CANCELLED
    elif current.status == Task.Status.SUPERSEDED:
        reason = QuarantinedResult.Reason.PLAN_SUPERSEDED
    else:
        reason = QuarantinedResult.Reason.LEASE_LOST
    QuarantinedResult.objects.create(
        run_id=lease.run_id,
        task_id=lease.task_id,
        reason=reason,
        fencing_token=lease.token,
        plan_version=task.plan_version,
        step=step,
        body=body,
        worker=lease.owner,
    )
    metrics.QUARANTINED.labels(reason).inc()
    log.warning("quarantined step %s of task %s (token %s): %s", step, lease.task_id, lease.token, reason)


def task_finish(lease: Lease, run: Run, task: Task, *, step: int, response, started, planned=None):
    """Journal the final answer, store the artifact and advance the DAG, in one transaction.
    Returns the Lease of a successor this worker claimed for itself, if any."""
    now = timezone.now()
    body = response.as_journal()
    provenance = {
        "task": task.key,
        "agent": task.agent_id,
        "attempt": lease.attempt,
        "fencing_token": lease.token,
        "model": response.model,
        "step": step,
        "inputs": sorted(task.depends_on),
    }
    try:
        with transaction.atomic():
            done = hot.finish(
                lease, run, task, step=step, response=response, started=started, now=now, body=body,
                provenance=provenance,
            )  # fmt: skip
            rows = done.ready + (hot.dependents_count_down(done.missed, now) if done.missed else [])
            ready = [claim_candidate(run.id, row) for row in rows]
            run_usage, plan_version, held_back = done.usage, done.plan_version, done.held_back
            RUN.seen(run, run_usage.status)  # as the statement above read it
            run.plan_version = plan_version
            if planned is not None and not plan_held(run, task, response.final, now):
                created = tasks_create(run=run, planned=planned[0], agents=planned[1], depth=task.depth + 1, now=now)
                ready += [t for t in created if t.status == Task.Status.READY]
            try:
                # The answer that crossed the budget is kept; nothing more starts.
                run_usage.check_after_step("run")
                over_budget = ""
            except BudgetExceeded as exc:
                over_budget = str(exc)
            return _advance(run, ready=ready, owner=lease.owner, now=now, stop_reason=over_budget, held_back=held_back)
    except LeaseLost:
        quarantine(lease, task, step=step, body=body, response=response)
        return None


def _advance(run: Run, *, ready: list, owner: str, now, stop_reason: str = "", held_back: int = 0):
    """After a task completed, with its newly ``ready`` dependents: claim one for this worker (the
    task-to-task hop, without a broker round trip) and send the others; finish the run when nothing is
    left. With ``stop_reason`` (a budget crossed) the run waits for a human instead. Call with the run locked."""
    if not ready and _run_settle(run, now, stop_reason=stop_reason):
        return None
    if stop_reason and run.status == Run.Status.RUNNING:
        run_transition(run=run, to=Run.Status.NEEDS_ATTENTION, reason=stop_reason, now=now)
    if run.status != Run.Status.RUNNING:
        return None  # paused: resume sends the ready ones
    if held_back:  # a slot is free again for tasks the concurrency cap held back
        Run.objects.filter(id=run.id).update(held_back=0)
        seen = {t.id for t in ready}
        ready += [t for t in Task.objects.filter(run_id=run.id, status=Task.Status.READY) if t.id not in seen]
    mine = None
    for candidate in ready:
        if mine is None:
            if faults.start_crash_due(run.input, run_id=run.id, task_key=candidate.key):
                # No message for it: no sibling thread may start it before this process dies.
                # It stays ready and the sweeper of the next worker re-drives it.
                mine = CRASH
                continue
            mine = claim(candidate, owner=owner, now=now)
            if mine is not None:
                continue
        outbox_add(actor=EXECUTE, kwargs={"run_id": run.id, "task_id": candidate.id})
    return mine


def _run_settle(run: Run, now, stop_reason: str = "") -> bool:
    """Nothing of the run became ready: complete it (or first ask for one approval of its proposals)
    when every task is done, or mark it waiting when all that is left waits for a reviewer.
    True when the run is finished with. Call with the run locked."""
    probe, probed = proposals_probe(run.id)  # asked in the same statement: most runs propose nothing
    statuses = {
        row[0]
        for row in sql.fetchall(
            "SELECT DISTINCT status FROM runs_task WHERE run_id = %s AND status NOT IN (%s, %s) "
            "AND NOT (status = %s AND plan_version < (SELECT plan_version FROM runs_run WHERE id = %s)) "
            f"UNION ALL {probe}",
            [run.id, Task.Status.COMPLETED, Task.Status.SUPERSEDED, Task.Status.FAILED, run.id, *probed],
        )
    }
    proposed = PROPOSED in statuses
    statuses.discard(PROPOSED)
    if not statuses:
        if run.status == Run.Status.RUNNING and not stop_reason:
            if proposals_bundle_if_any(run, now, proposed=proposed):
                return True
        if run.status in (Run.Status.RUNNING, Run.Status.NEEDS_ATTENTION):
            why = stop_reason or run.status_reason or "the run needed attention"
            dropped = proposals_drop(run, reason=why, proposed=proposed)
            note = f"; {dropped} proposals not executed" if dropped else ""
            run_transition(run=run, to=Run.Status.COMPLETED, reason=f"all tasks completed{note}", now=now)
        return True
    waiting = Task.Status.WAITING_FOR_APPROVAL
    if run.status == Run.Status.RUNNING and waiting in statuses and statuses <= {waiting, Task.Status.PENDING}:
        run_transition(run=run, to=Run.Status.WAITING_FOR_APPROVAL, reason="the remaining work waits for a reviewer")
    return False


def task_park(lease: Lease, *, operation_id: int, reason: str) -> bool:
    """The attempt's tool call waits for a reviewer: release the lease and wait (same attempt when it
    goes on). False when the decision came first: the caller just carries on."""
    now = timezone.now()
    with transaction.atomic():
        run, task = _lock_own_task(lease)
        if not operation_awaits_decision(operation_id):
            return False
        TASK.move(
            task,
            Task.Status.WAITING_FOR_APPROVAL,
            status_reason=reason[:4000],
            continuing=True,
            lease_owner="",
            lease_expires_at=None,
        )
        _run_settle(run, now)
    return True


def retry_delay_seconds(attempt: int) -> float:
    """Exponential backoff with equal jitter and a cap."""
    cfg = settings.WARDEN
    ceiling = min(cfg["RETRY_CAP_SECONDS"], cfg["RETRY_BASE_SECONDS"] * 2 ** max(0, attempt - 1))
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def _lock_own_task(lease: Lease):
    """Lock the run, then check this lease still holds the task. Call inside transaction.atomic()."""
    run = Run.objects.select_for_update().get(id=lease.run_id)
    task = Task.objects.select_for_update().get(id=lease.task_id)
    if task.fencing_token != lease.token or task.status != Task.Status.RUNNING:
        raise LeaseLost(f"task {lease.task_id}: token {lease.token} no longer holds the lease")
    return run, task


def task_fail_or_retry(lease: Lease, exc: StepFailure) -> None:
    """Transient failures retry with backoff while attempts remain; anything else fails the task."""
    now = timezone.now()
    reason = str(exc)
    try:
        with transaction.atomic():
            run, task = _lock_own_task(lease)
            sql.end_spans([lease.span_id], now=now, status=Span.Status.ERROR, attributes={"error": reason[:2000]})
            bus.run_changed(run.id)
            retryable = isinstance(exc, TransientFailure) or exc.failure_class == "transient"
            if retryable and task.attempts < task.max_attempts + task.recoveries and run.status == Run.Status.RUNNING:
                delay = retry_delay_seconds(task.attempts)
                TASK.move(
                    task,
                    Task.Status.RETRY_WAIT,
                    failure_class=exc.failure_class,
                    status_reason=reason[:4000],
                    not_before=now + timezone.timedelta(seconds=delay),
                    lease_owner="",
                    lease_expires_at=None,
                )
                outbox_add(actor=EXECUTE, kwargs={"run_id": run.id, "task_id": task.id}, delay_ms=int(delay * 1000))
            elif run.status == Run.Status.CANCELLING:
                _cancel_own(task, run, now)
            else:
                fail_task(task=task, run=run, failure_class=exc.failure_class, reason=reason, now=now)
    except LeaseLost:
        pass


def _cancel_own(task: Task, run: Run, now) -> None:
    TASK.move(
        task,
        Task.Status.CANCELLED,
        status_reason="run cancelled",
        finished_at=now,
        lease_owner="",
        lease_expires_at=None,
    )
    Span.objects.filter(task=task, ended_at__isnull=True).update(ended_at=now, status=Span.Status.ERROR)
    bus.run_changed(run.id)
    run_finish_cancel_if_idle(run=run, now=now)


def task_stop_cancelled(lease: Lease) -> None:
    """Cooperative cancellation, checked between steps."""
    try:
        with transaction.atomic():
            run, task = _lock_own_task(lease)
            _cancel_own(task, run, timezone.now())
    except LeaseLost:
        pass


def task_yield(lease: Lease, *, delay_seconds: float = 0.0, reason: str = "") -> None:
    """This attempt has run a whole slice (or waits a moment, ``reason``): hand the rest to a fresh message
    (same attempt), ``delay_seconds`` from now."""
    now = timezone.now()
    try:
        with transaction.atomic():
            run, task = _lock_own_task(lease)
            TASK.move(task, Task.Status.READY, continuing=True, ready_at=now, lease_owner="", lease_expires_at=None,
                      status_reason=reason)  # fmt: skip
            outbox_add(actor=EXECUTE, kwargs={"run_id": run.id, "task_id": task.id}, delay_ms=int(delay_seconds * 1000))
    except LeaseLost:
        pass
