"""The recovery sweeper: always on, in every worker process and in the embedded server.

Each pass expires dead leases, re-sends what the outbox still holds, re-drives ready tasks whose
message was lost, forces cancellations past their grace period, stops runs past their deadline and
probes half-open breakers whose tasks are all parked (runs/services/breakers.py);
now and then it prunes the journals of old finished runs (runs/retention.py).
Every change is a compare-and-set or happens under a row lock, so several sweepers may run at once.
"""

import logging
import threading
import time

import dramatiq
from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import F
from django.utils import timezone
from dramatiq.middleware import Middleware

from core import bus, hooks, metrics

from ..models import Outbox, Run, Span, Task
from ..retention import retention_sweep
from ..transitions import TASK
from ..workers import registration
from .breakers import breakers_sweep
from .failure import fail_task
from .leases import record_lease_expiry
from .outbox import outbox_add, outbox_deliver
from .runs import EXECUTE, run_finish_cancel_if_idle, run_transition

log = logging.getLogger("warden.recovery")
BATCH = 200


def _seconds_ago(now, seconds: float):
    return now - timezone.timedelta(seconds=seconds)


def _recovery_span(*, run_id: int, task_id: int | None, name: str, now, **attributes) -> None:
    """A recovery in the trace: under the task's span when it concerns a task, else under the run's."""
    bus.run_changed(run_id)
    spans = Span.objects.filter(run_id=run_id)
    parent_id = None
    if task_id:
        parent_id = spans.filter(kind=Span.Kind.TASK, task_id=task_id).values_list("id", flat=True).first()
    if parent_id is None:  # a task not started yet has no span of its own: under the run's
        parent_id = spans.filter(kind=Span.Kind.RUN).values_list("id", flat=True).first()
    Span.objects.create(
        run_id=run_id,
        task_id=task_id,
        kind=Span.Kind.RECOVERY,
        name=name,
        started_at=now,
        ended_at=now,
        parent_id=parent_id,
        attributes=attributes,
    )


def expire_leases(now) -> int:
    count = 0
    expired = Task.objects.filter(status=Task.Status.RUNNING, lease_expires_at__lt=now).values_list("id", "run_id")[
        :BATCH
    ]
    for task_id, run_id in list(expired):
        with transaction.atomic():
            run = Run.objects.select_for_update().get(id=run_id)
            task = Task.objects.select_for_update().get(id=task_id)
            if task.status != Task.Status.RUNNING or task.lease_expires_at is None or task.lease_expires_at >= now:
                continue  # renewed or finished meanwhile
            record_lease_expiry(task=task, now=now)
            # A new token at once: the lost holder is fenced even before anyone claims the task.
            Task.objects.filter(id=task.id).update(
                fencing_token=F("fencing_token") + 1, lease_owner="", lease_expires_at=None
            )
            task.refresh_from_db()
            if run.status == Run.Status.CANCELLING:
                TASK.move(task, Task.Status.CANCELLED, finished_at=now)
                Span.objects.filter(task=task, ended_at__isnull=True).update(ended_at=now, status=Span.Status.ERROR)
                bus.run_changed(run.id)
                run_finish_cancel_if_idle(run=run, now=now)
            elif task.recoveries > settings.WARDEN["MAX_RECOVERIES"]:
                fail_task(
                    task=task,
                    run=run,
                    failure_class=Task.FailureClass.CRASH,
                    reason=f"its worker was lost {task.recoveries} times",
                    now=now,
                )
            else:
                TASK.move(task, Task.Status.READY, ready_at=now)
                if run.status == Run.Status.RUNNING:
                    outbox_add(actor=EXECUTE, kwargs={"run_id": run.id, "task_id": task.id})
            count += 1
    return count


def resend_outbox(now) -> int:
    """Send what a crash left in the outbox. Rows are claimed by moving their timestamp (a
    compare-and-set, so of several sweepers one sends each row), then sent outside any transaction."""
    stale = _seconds_ago(now, settings.WARDEN["OUTBOX_RESEND_AFTER_SECONDS"])
    rows = list(Outbox.objects.filter(created_at__lt=stale).order_by("id")[:BATCH])
    claimed = [
        row for row in rows if Outbox.objects.filter(id=row.id, created_at=row.created_at).update(created_at=now)
    ]
    return outbox_deliver(rows=claimed) if claimed else 0


def redrive_ready(now) -> int:
    """Ready tasks nobody picked up (a lost message, a restarted embedded server) get a new message."""
    stale = _seconds_ago(now, settings.WARDEN["REDRIVE_AFTER_SECONDS"])
    candidates = list(
        Task.objects.filter(run__status=Run.Status.RUNNING, status=Task.Status.READY, ready_at__lt=stale).values_list(
            "id", "run_id", "ready_at"
        )[:BATCH]
    ) + list(
        Task.objects.filter(
            run__status=Run.Status.RUNNING, status=Task.Status.RETRY_WAIT, not_before__lt=stale
        ).values_list("id", "run_id", "not_before")[:BATCH]
    )
    actor = dramatiq.get_broker().get_actor(EXECUTE)
    sent = 0
    for task_id, run_id, since in candidates:
        # Compare-and-set on the timestamp: of several sweepers, one re-drives.
        bumped = Task.objects.filter(id=task_id, ready_at=since).update(ready_at=now) if since else 0
        if not bumped:
            bumped = Task.objects.filter(id=task_id, status=Task.Status.RETRY_WAIT, not_before=since).update(
                not_before=now
            )
        if bumped:
            actor.send(run_id=run_id, task_id=task_id)
            _recovery_span(
                run_id=run_id, task_id=task_id, name="re-driven: not picked up", now=now, waited_since=str(since)
            )
            sent += 1
    return sent


def reap_cancelled(now) -> int:
    """Cancellation is cooperative; past the grace period the reaper forces the final state."""
    grace = _seconds_ago(now, settings.WARDEN["CANCEL_GRACE_SECONDS"])
    reaped = 0
    for run_id in list(
        Run.objects.filter(status=Run.Status.CANCELLING, cancel_requested_at__lt=grace).values_list("id", flat=True)[
            :BATCH
        ]
    ):
        with transaction.atomic():
            run = Run.objects.select_for_update().get(id=run_id)
            if run.status != Run.Status.CANCELLING:
                continue
            stuck = list(run.tasks.select_for_update().exclude(status__in=Task.TERMINAL))
            TASK.move_where(
                Task.objects.filter(id__in=[t.id for t in stuck]),
                Task.Status.CANCELLED,
                status_reason="forced by the reaper after the grace period",
                fencing_token=F("fencing_token") + 1,
                lease_owner="",
                lease_expires_at=None,
                finished_at=now,
            )
            bus.run_changed(run.id)
            Span.objects.filter(run=run, ended_at__isnull=True).exclude(kind=Span.Kind.RUN).update(
                ended_at=now, status=Span.Status.ERROR
            )
            _recovery_span(
                run_id=run.id, task_id=None, name="reaper: forced cancellation", now=now, tasks=[t.key for t in stuck]
            )
            run_transition(run=run, to=Run.Status.CANCELLED, reason=run.status_reason, now=now)
            reaped += 1
    return reaped


def stop_overdue(now) -> int:
    overdue = 0
    for run_id in list(
        Run.objects.filter(status=Run.Status.RUNNING, deadline__lt=now).values_list("id", flat=True)[:BATCH]
    ):
        with transaction.atomic():
            run = Run.objects.select_for_update().get(id=run_id)
            if run.status == Run.Status.RUNNING:
                run_transition(run=run, to=Run.Status.NEEDS_ATTENTION, reason="run budget exceeded: deadline", now=now)
                overdue += 1
    return overdue


def sweep_once() -> dict:
    now = timezone.now()
    return {
        "leases_expired": expire_leases(now),
        "outbox_resent": resend_outbox(now),
        "tasks_redriven": redrive_ready(now),
        "runs_reaped": reap_cancelled(now),
        "runs_overdue": stop_overdue(now),
        **breakers_sweep(now),
        **_ledger_sweep(now),
    }


def _ledger_sweep(now) -> dict:
    counts = {}
    # The passes the layers above own: the ledger's, the approvals' and the integrations' (their apps.py).
    for sweep in hooks.sweeps():
        counts.update(sweep(now))
    return {
        **counts,
        "runs_pruned": retention_sweep(now),  # once an hour at most while there is no backlog
    }


class RecoverySweeper:
    """Runs sweep_once every SWEEP_INTERVAL_SECONDS on a daemon thread."""

    def __init__(self):
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.threads = 0  # the worker threads of this process, for its registry row

    def start(self, *, threads: int = 0) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self.threads = threads
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(self._stop,), name="warden-sweeper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
            try:
                registration.stopped()
            except Exception:  # the database is away: the row goes stale, read as gone
                log.warning("could not mark this worker stopped in the registry")
        self._thread = None

    def _loop(self, stop: threading.Event) -> None:
        registered = False
        while not stop.wait(settings.WARDEN["SWEEP_INTERVAL_SECONDS"]):
            close_old_connections()
            try:
                if not registered:
                    registration.started(threads=self.threads)
                    registered = True
                started = time.monotonic()
                done = sweep_once()
                metrics.SWEEP_SECONDS.observe(time.monotonic() - started)
                for action, count in done.items():
                    if count:
                        metrics.SWEEP_ACTIONS.labels(action).inc(count)
                registration.swept()
                if any(done.values()):
                    log.info("recovery sweep: %s", done)
            except Exception:
                log.exception("recovery sweep failed; next pass in %ss", settings.WARDEN["SWEEP_INTERVAL_SECONDS"])
                connection.close()
        connection.close()


sweeper = RecoverySweeper()


class RecoverySweeperMiddleware(Middleware):
    """Every worker process runs the sweeper, registers itself (runs/workers.py) and counts its messages:
    the hop (enqueued until picked up) and the outcome, by actor (core/metrics.py). Added to the broker by
    runs/apps.py: the broker the settings describe is built before the models load."""

    def after_worker_boot(self, broker, worker):
        sweeper.start(threads=worker.worker_threads)

    def before_worker_shutdown(self, broker, worker):
        sweeper.stop()
        metrics.process_exited()

    def before_process_message(self, broker, message):
        # From when it was due: a delayed message (a retry's backoff) waits on purpose until its eta.
        due = max(message.message_timestamp, message.options.get("eta") or 0) / 1000
        waited = time.time() - due
        metrics.HOP_SECONDS.labels(metrics.bounded(message.actor_name)).observe(max(0.0, waited))

    def after_process_message(self, broker, message, *, result=None, exception=None):
        outcome = "ok" if exception is None else "error"
        metrics.MESSAGES.labels(metrics.bounded(message.actor_name), outcome).inc()

    after_skip_message = after_process_message
