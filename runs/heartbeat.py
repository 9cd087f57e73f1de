"""One thread per process renews the leases of the attempts this process is running.

Steps renew their own lease as they are journaled; the heartbeat covers a long model or tool call.
A frozen or dead process renews nothing, so its leases expire and can be taken over.
"""

import threading

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from .models import Run, Task


class LeaseKeeper:
    def __init__(self):
        self._leases: dict[int, int] = {}  # task id -> fencing token
        self._executors: dict[int, int] = {}  # run id -> the supervisor's executor lease token
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(self, task_id: int, token: int) -> None:
        with self._lock:
            self._leases[task_id] = token
            self._started()

    def _started(self) -> None:
        """Call with the lock held."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="warden-heartbeat", daemon=True)
            self._thread.start()

    def release(self, task_id: int) -> None:
        with self._lock:
            self._leases.pop(task_id, None)

    def hold_executor(self, run_id: int, token: int) -> None:
        """The supervisor's executor of a run (saga/executor.py) holds the run's executor lease."""
        with self._lock:
            self._executors[run_id] = token
            self._started()

    def release_executor(self, run_id: int) -> None:
        with self._lock:
            self._executors.pop(run_id, None)

    def _interval(self) -> float:
        cfg = settings.WARDEN
        return cfg["HEARTBEAT_SECONDS"] or cfg["LEASE_SECONDS"] / 3

    def _loop(self) -> None:
        stop = threading.Event()
        while not stop.wait(self._interval()):
            with self._lock:
                held, executors = list(self._leases.items()), list(self._executors.items())
            if not held and not executors:
                connection.close()  # idle: hold no database connection
                continue
            close_old_connections()
            try:
                self.beat(held, executors)
            except Exception:  # the database is away: the lease may lapse, which the engine tolerates
                connection.close()

    @staticmethod
    def beat(held: list[tuple[int, int]], executors: list[tuple[int, int]] = ()) -> None:
        now = timezone.now()
        expires = now + timezone.timedelta(seconds=settings.WARDEN["LEASE_SECONDS"])
        for task_id, token in held:
            Task.objects.filter(id=task_id, fencing_token=token, status=Task.Status.RUNNING).update(
                heartbeat_at=now, lease_expires_at=expires
            )
        for run_id, token in executors:
            Run.objects.filter(id=run_id, ops_lease_token=token).update(ops_lease_expires_at=expires)


lease_keeper = LeaseKeeper()
