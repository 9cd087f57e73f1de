"""The registry of worker processes: each one's row, stamped by its own recovery sweeper.

A process that runs attempts (a ``rundramatiq`` worker, the embedded server) writes its row when its
sweeper starts and stamps it every few seconds after a pass; a clean stop says so. A row not stamped for
a lease's time is a process that died or froze: its leases expire in the same time and its tasks go to
others. Rows of processes stopped or gone a day ago are deleted.
"""

import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

import dramatiq
from django.conf import settings
from django.utils import timezone

from .models import Task, WorkerProcess

KEEP_GONE = timezone.timedelta(days=1)


def process_name() -> str:
    """host:pid, the start of every lease_owner this process writes (runs/services/leases.py)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def gone_after() -> float:
    return settings.WARDEN["WORKER_GONE_SECONDS"] or settings.WARDEN["LEASE_SECONDS"]


def _stamp_every() -> float:
    return min(5.0, gone_after() / 3)


class Registration:
    """This process's row: written at start, stamped at most every few seconds, closed at a clean stop."""

    def __init__(self):
        self._stamped = 0.0

    def started(self, *, threads: int) -> None:
        now = timezone.now()
        WorkerProcess.objects.update_or_create(
            name=process_name(),
            defaults={
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "kind": WorkerProcess.Kind.WORKER if settings.REDIS_URL else WorkerProcess.Kind.EMBEDDED,
                "threads": threads,
                "started_at": now,
                "beat_at": now,
                "swept_at": None,
                "stopped_at": None,
            },
        )
        self._stamped = time.monotonic()

    def swept(self) -> None:
        """After a sweeper pass: stamp the row when it is due (one UPDATE every few seconds)."""
        if time.monotonic() - self._stamped < _stamp_every():
            return
        now = timezone.now()
        WorkerProcess.objects.filter(name=process_name()).update(beat_at=now, swept_at=now, stopped_at=None)
        WorkerProcess.objects.filter(beat_at__lt=now - KEEP_GONE).delete()
        self._stamped = time.monotonic()

    def stopped(self) -> None:
        WorkerProcess.objects.filter(name=process_name()).update(stopped_at=timezone.now())


registration = Registration()


@dataclass
class WorkerRow:
    name: str
    host: str
    pid: int
    kind: str
    threads: int
    started_at: datetime
    heartbeat_age: float
    state: str  # live, gone (stopped stamping), stopped (a clean stop)
    tasks: list[dict] = field(default_factory=list)  # the tasks it holds, of the projects the caller may see


def workers_list(*, project_ids: list[int] | None, now=None) -> list[WorkerRow]:
    """Every registered process, live first, with the running tasks it holds; ``project_ids`` narrows
    the tasks shown (None: all). Two queries."""
    now = now or timezone.now()
    rows = []
    for w in WorkerProcess.objects.all():
        age = max(0.0, (now - w.beat_at).total_seconds())
        state = "stopped" if w.stopped_at else ("gone" if age > gone_after() else "live")
        rows.append(WorkerRow(w.name, w.host, w.pid, w.kind, w.threads, w.started_at, round(age, 1), state))
    by_name = {row.name: row for row in rows}
    running = Task.objects.filter(status=Task.Status.RUNNING).exclude(lease_owner="")
    if project_ids is not None:
        running = running.filter(run__project_id__in=project_ids)
    for task_id, run_id, key, owner, expires in running.values_list(
        "id", "run_id", "key", "lease_owner", "lease_expires_at"
    ).order_by("id"):
        row = by_name.get(owner.rsplit(":", 1)[0])  # host:pid:thread
        if row is not None:
            row.tasks.append({"task_id": task_id, "run_id": run_id, "key": key, "lease_expires_at": expires})
    return sorted(rows, key=lambda r: ({"live": 0, "gone": 1, "stopped": 2}[r.state], r.host, r.pid))


@contextmanager
def workers_while_waiting(threads: int = 2):
    """A command that starts runs and waits for them (run_evals, replay): in embedded mode, the server's
    workers use its in-memory broker, out of this process's reach, so this process runs worker threads
    while it waits; in scaled mode the rundramatiq workers do."""
    worker = None
    if not settings.WARDEN_SCALED:
        worker = dramatiq.Worker(dramatiq.get_broker(), worker_threads=threads, worker_timeout=100)
        worker.start()
    try:
        yield
    finally:
        if worker is not None:
            worker.stop()
