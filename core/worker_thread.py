"""One daemon thread per process that takes work handed over after commit (dashboard.live's publisher,
runs.services.outbox's forgetter): started when the first work arrives, started again in a forked child,
waited for by flush and ended by stop (test teardown closes its database connection before the test
database is dropped).

A subclass keeps its work under ``self._cv``, says whether any is left (``_has_work``), hands new work
over with ``_wake()`` (holding ``self._cv``), and writes ``_run``: a loop that waits with ``_await_work()``
(returning when it says so), takes a batch under ``self._cv`` with ``self._busy`` set, and calls
``_done()`` when the batch is done.
"""

import threading
import time

from django.db import connection


class WorkerThread:
    name = "warden-worker"
    IDLE_CLOSE_SECONDS = 1.0  # close the thread's database connection when idle (tests drop databases)

    def __init__(self):
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._busy = False
        self._stopping = False

    def _has_work(self) -> bool:
        raise NotImplementedError

    def _run(self) -> None:
        raise NotImplementedError

    def _await_work(self) -> bool:
        """Call holding ``self._cv`` at the top of ``_run``'s loop: True once there is work, False when the
        thread is to end. The thread's database connection is closed while it waits with none."""
        while not self._has_work():
            if self._stopping:
                connection.close()
                return False
            self._cv.wait(self.IDLE_CLOSE_SECONDS)
            if not self._has_work():
                connection.close()
        return True

    def _done(self) -> None:
        """Call when a batch is done (``self._busy`` was set): flush's waiters look again."""
        with self._cv:
            self._busy = False
            self._cv.notify_all()

    def _wake(self) -> None:
        """Call holding ``self._cv``, after adding work."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        self._cv.notify()

    def flush(self, timeout: float = 10) -> None:
        """Wait until everything handed over so far is done (tests, benchmarks, a process about to exit)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while (self._has_work() or self._busy) and time.monotonic() < deadline:
                self._cv.wait(0.01)

    def stop(self, timeout: float = 10) -> None:
        """Finish what is in hand, then end the thread (which closes its database connection)."""
        thread = self._thread
        if thread is None:
            return
        self.flush(timeout)
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        thread.join(timeout)
        with self._cv:
            self._stopping, self._thread = False, None
