"""What the dashboard learns, sent only after commit.

A service that changes a run calls ``run_changed(run_id)`` inside its transaction. After commit the run
id goes to this process's publisher thread, which coalesces bursts, renders the changed parts of the run
page (and the run's row of the runs list) once, and sends them through the channel layer to the run's
group and its project's list group. The worker that committed pays for a queue put, nothing more, and
nothing is rendered or sent while nobody watches (viewers announce themselves with a short-lived
presence key, refreshed while their socket is open).

The socket is lossy by nature (a full channel, a Redis reconnect, a closed tab): every push carries a
per-run sequence number from a shared counter, and a browser that sees a gap, or reconnects, re-renders
from the database (static/warden/live.js). See docs/dashboard.md.
"""

import asyncio
import json
import logging
import os
import threading
import time
from contextlib import contextmanager

from channels.layers import get_channel_layer
from django.conf import settings
from django.core.cache import cache
from django.db import close_old_connections, connection, transaction

from .shared import tolerant

log = logging.getLogger("warden.events")

PRESENCE_SECONDS = 60
LIST_PRESENCE = "watch:runs"


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


def list_group(project_id: int) -> str:
    return f"runs-{project_id}"


def run_presence(run_id: int) -> str:
    return f"watch:run:{run_id}"


def run_seq_name(run_id: int) -> str:
    return f"run-{run_id}"


def list_seq_name(project_id: int) -> str:
    return f"project-{project_id}"


def seq_current(name: str) -> int:
    return tolerant(lambda: cache.get(f"seq:{name}", 0), 0)


def seq_next(name: str) -> int:
    key = f"seq:{name}"
    try:
        return cache.incr(key)
    except ValueError:
        cache.add(key, 0, timeout=None)
        return cache.incr(key)


def list_seqs(project_ids: list[int] | None) -> dict[str, int]:
    """The runs list's sequence number per project (``None``: every project, for a superuser)."""
    if project_ids is None:
        from approvals.models import Project

        project_ids = list(Project.objects.values_list("id", flat=True))
    keys = {f"seq:{list_seq_name(p)}": str(p) for p in project_ids}
    found = tolerant(lambda: cache.get_many(list(keys)), {})
    return {p: found.get(k, 0) for k, p in keys.items()}


def watching(*keys: str) -> None:
    """Announce a viewer (a page being rendered, an open socket) so changes are published."""
    tolerant(lambda: cache.set_many(dict.fromkeys(keys, 1), timeout=PRESENCE_SECONDS), None)


def run_changed(run_id: int) -> None:
    """Call in the transaction that changed the run: its viewers learn after commit, never on rollback.

    Registered once per run and transaction. Django replaces its list of commit hooks on commit and
    on every rollback, so the list's identity tells whether our earlier registration is still alive.
    """
    conn = transaction.get_connection()
    if not conn.in_atomic_block:
        publisher.push(run_id)
        return
    hooks = conn.run_on_commit
    state = getattr(conn, "_warden_changed", None)
    if state is None or state[0] is not hooks:
        state = conn._warden_changed = (hooks, set())
    if run_id in state[1]:
        return
    state[1].add(run_id)
    transaction.on_commit(lambda: publisher.push(run_id))


def access_changed(user_id: int) -> None:
    """A membership of this user changed: their open sockets check again what they may see."""
    transaction.on_commit(lambda: publisher.push_user(user_id))


class Publisher:
    """One daemon thread per process: renders each changed run once per burst and sends it."""

    IDLE_CLOSE_SECONDS = 1.0  # close the thread's database connection when idle (tests drop databases)
    # After a batch that took T, wait DUTY × T (at most DUTY_CAP) before the next one: changes meanwhile
    # are coalesced, and a worker's publisher never takes more than about a quarter of its process's
    # time from the worker threads, however fast a watched run moves.
    DUTY = 3.0
    DUTY_CAP = 0.25

    def __init__(self):
        self._cv = threading.Condition()
        self._pending: dict[int, None] = {}
        self._users: dict[int, None] = {}
        self._thread: threading.Thread | None = None
        self._busy = False
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        # The in-memory channel layer (embedded mode) must be used from the event loop of the server
        # that owns its queues; consumers register it here when they connect.
        self.server_loop: asyncio.AbstractEventLoop | None = None

    def push(self, run_id: int) -> None:
        with self._cv:
            self._pending[run_id] = None
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="warden-events", daemon=True)
                self._thread.start()
            self._cv.notify()

    def push_user(self, user_id: int) -> None:
        with self._cv:
            self._users[user_id] = None
        self.push(0)

    def flush(self, timeout: float = 10) -> None:
        """Wait until everything pushed so far is published (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while (self._pending or self._busy) and time.monotonic() < deadline:
                self._cv.wait(0.01)

    def stop(self, timeout: float = 10) -> None:
        """Publish what is pending, close the thread's database connection and end it (test teardown)."""
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

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        while True:
            with self._cv:
                if not self._pending and not self._stopping:
                    self._cv.wait(self.IDLE_CLOSE_SECONDS)
                if self._stopping and not self._pending:
                    connection.close()
                    return
                if not self._pending:
                    connection.close()
                    continue
                batch, self._pending, self._busy = list(self._pending), {}, True
                users, self._users = list(self._users), {}
            started = time.monotonic()
            try:
                close_old_connections()
                for user_id in users:
                    self.send(f"user-{user_id}", "", kind="access.changed")
                for run_id in batch:
                    if run_id:
                        publish(run_id)
            except Exception:  # a failed push is a gap the browsers recover from
                log.exception("publishing changes of runs %s failed", batch)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()
            time.sleep(min((time.monotonic() - started) * self.DUTY, self.DUTY_CAP))

    def send(self, group: str, text: str, kind: str = "push") -> None:
        """Called from the publisher thread only (it owns the event loop used for channels-redis)."""
        layer = get_channel_layer()
        if layer is None:
            return
        message = {"type": kind, "text": text}
        if _in_memory(layer):
            loop = self.server_loop
            if loop is None or loop.is_closed():
                return  # no socket has ever connected in this process: nobody to tell
            asyncio.run_coroutine_threadsafe(layer.group_send(group, message), loop).result(timeout=5)
        else:
            self._loop.run_until_complete(layer.group_send(group, message))


def _in_memory(layer) -> bool:
    return type(layer).__name__ == "InMemoryChannelLayer"


publisher = Publisher()


_forgotten: dict[int, float] = {}


def _forget_mark(run_id: int) -> None:
    """Nobody watches this run: its watermark would go stale, and the next viewer's first push would
    carry everything since. Dropped (once a minute at most per process), the next push is a re-render."""
    from runs.views.run_page import mark_forget

    now = time.monotonic()
    if now - _forgotten.get(run_id, -PRESENCE_SECONDS) >= PRESENCE_SECONDS:
        _forgotten[run_id] = now
        mark_forget(run_id)
        if len(_forgotten) > 10_000:
            _forgotten.clear()


def publish(run_id: int) -> None:
    """Render what changed in the run and send it to whoever watches. Runs in the publisher thread."""
    from runs.errors import NotFound
    from runs.listing import run_row_html
    from runs.views.run_page import run_push

    present = cache.get_many([run_presence(run_id), LIST_PRESENCE])
    if run_presence(run_id) not in present:
        _forget_mark(run_id)
    if not present:
        return
    # One publisher at a time per run, across processes: render, number, send. So numbers follow the
    # order of the renders (a higher number never carries older content), and a page that read its
    # number before its data holds everything a push with a number up to its own carried.
    with _run_lock(run_id):
        if run_presence(run_id) in present:
            body = run_push(run_id)
            if body is not None:
                seq = seq_next(run_seq_name(run_id))
                publisher.send(run_group(run_id), json.dumps({"seq": seq, **body}))
        if LIST_PRESENCE in present:
            try:
                project_id, html = run_row_html(run_id)
            except NotFound:
                return
            seq = seq_next(list_seq_name(project_id))
            publisher.send(list_group(project_id), json.dumps({"project": project_id, "seq": seq, "html": html}))


_local_locks: dict[int, threading.Lock] = {}
_redis = None


@contextmanager
def _run_lock(run_id: int, wait: float = 5.0, hold: float = 10.0):
    """One publisher per run at a time: a Redis lock across processes in scaled mode (redis-py's, whose
    release is an atomic compare-and-delete), a thread lock in embedded mode (one process). After
    ``wait`` we go on without it: a late push is better than none, and the browser's gap check holds."""
    global _redis
    if settings.REDIS_URL:
        if _redis is None:
            import redis

            _redis = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5)
        namespace = os.environ.get("WARDEN_QUEUE_NAMESPACE", "warden")
        lock = _redis.lock(f"{namespace}:lock:publish:{run_id}", timeout=hold, blocking_timeout=wait)
        acquired = lock.acquire()
    else:
        lock = _local_locks.setdefault(run_id, threading.Lock())
        acquired = lock.acquire(timeout=wait)
    try:
        yield
    finally:
        if acquired:
            try:
                lock.release()
            except Exception:  # expired meanwhile (redis LockNotOwnedError): nothing of ours to release
                log.warning("publish lock of run %s expired before its release", run_id)
