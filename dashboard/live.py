"""What the dashboard learns, sent only after commit.

A service that changes a run calls ``core.bus.run_changed(run_id)`` inside its transaction. After commit
the run id reaches this module's listener (registered by ``dashboard.apps``) and goes to this process's
publisher thread, which coalesces bursts, renders the changed parts of the run page (and the run's row of
the runs list) once, and sends them through the channel layer to the run's group and its project's list
group. The worker that committed pays for a queue put, nothing more, and nothing is rendered or sent
while nobody watches (viewers announce themselves in ``dashboard.presence``).

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
from django.db import close_old_connections

from core.errors import NotFound
from core.worker_thread import WorkerThread
from dashboard.listing import run_row_html
from dashboard.presence import (
    INBOX_PRESENCE,
    LIST_PRESENCE,
    PRESENCE_SECONDS,
    inbox_group,
    list_group,
    list_seq_name,
    run_group,
    run_presence,
    run_seq_name,
    seq_next,
)
from dashboard.views.run_page import mark_forget, run_push
from runs.models import Run

log = logging.getLogger("warden.events")


class Publisher(WorkerThread):
    """One daemon thread per process: renders each changed run once per burst and sends it."""

    # After a batch that took T, wait DUTY × T (at most DUTY_CAP) before the next one: changes meanwhile
    # are coalesced, and a worker's publisher never takes more than about a quarter of its process's
    # time from the worker threads, however fast a watched run moves.
    DUTY = 3.0
    DUTY_CAP = 0.25
    # After a pass that found nobody watching, wait at least this long: a busy worker's unwatched runs
    # then cost a presence lookup 20 times a second, not once per step. A viewer who arrives meanwhile
    # gets the change at the next pass (late by this much at most, never lost: the run stays pending
    # only until that pass, which reads presence again).
    IDLE_PASS_SECONDS = 0.05

    name = "warden-events"

    def __init__(self):
        super().__init__()
        self._pending: dict[int, None] = {}
        self._users: dict[int, None] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        # The in-memory channel layer (embedded mode) must be used from the event loop of the server
        # that owns its queues; consumers register it here when they connect.
        self.server_loop: asyncio.AbstractEventLoop | None = None

    def push(self, run_id: int) -> None:
        with self._cv:
            self._pending[run_id] = None
            self._wake()

    def push_user(self, user_id: int) -> None:
        with self._cv:
            self._users[user_id] = None
        self.push(0)

    def _has_work(self) -> bool:
        return bool(self._pending)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        while True:
            with self._cv:
                if not self._await_work():
                    return
                batch, self._pending, self._busy = list(self._pending), {}, True
                users, self._users = list(self._users), {}
            started, watched = time.monotonic(), bool(users)
            try:
                close_old_connections()
                for user_id in users:
                    self.send(f"user-{user_id}", "", kind="access.changed")
                for run_id in batch:
                    if run_id and publish(run_id):
                        watched = True
            except Exception:  # a failed push is a gap the browsers recover from
                log.exception("publishing changes of runs %s failed", batch)
            finally:
                self._done()
            pause = min((time.monotonic() - started) * self.DUTY, self.DUTY_CAP)
            time.sleep(pause if watched else max(pause, self.IDLE_PASS_SECONDS))

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
    now = time.monotonic()
    if now - _forgotten.get(run_id, -PRESENCE_SECONDS) >= PRESENCE_SECONDS:
        _forgotten[run_id] = now
        mark_forget(run_id)
        if len(_forgotten) > 10_000:
            _forgotten.clear()


def publish(run_id: int) -> bool:
    """Render what changed in the run and send it to whoever watches; False when nobody does. Runs in
    the publisher thread."""
    present = cache.get_many([run_presence(run_id), LIST_PRESENCE, INBOX_PRESENCE])
    if run_presence(run_id) not in present:
        _forget_mark(run_id)
    if not present:
        return False
    if INBOX_PRESENCE in present:
        _inbox_nudge(run_id)
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
                return True
            seq = seq_next(list_seq_name(project_id))
            publisher.send(list_group(project_id), json.dumps({"project": project_id, "seq": seq, "html": html}))
    return True


def _inbox_nudge(run_id: int) -> None:
    """Something in the run's project changed: the open navs of its members fetch their counts again.
    The nudge carries nothing but the project's id; the count is read with the reader's own rights."""
    project_id = Run.objects.filter(id=run_id).values_list("project_id", flat=True).first()
    if project_id is not None:
        publisher.send(inbox_group(project_id), json.dumps({"inbox": project_id}))


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


def run_changed(run_id: int) -> None:
    """The listener of ``core.bus.run_changed``: called after the commit that changed the run."""
    publisher.push(run_id)


def access_changed(user_id: int) -> None:
    """The listener of ``core.bus.access_changed``: the user's open sockets check again what they may see."""
    publisher.push_user(user_id)
