"""MCP sessions kept per worker process and server (docs/tools.md, "MCP sessions").

A stdio server used to be started for every call (a Python server: ~0.3 s of CPU before its first
answer) and an HTTP server shaken hands with for every call. Here each process keeps one session per
server and per what the server was given (its command or address, its environment and headers with
the secrets' values: a rotated secret or a changed declaration opens a new session), on one event loop
thread of the process:

- a stdio server is started once per process and restarted when it has died: its end is seen on the
  session's read stream, so the next call opens a new session before it sends anything;
- an HTTP server that answers "Session not found" (it restarted) never ran the call: the session is
  opened again and the call sent once more; a server that refuses the connection was not reached;
- a fork inherits no session: the child opens its own (its parent's event loop thread is not in it);
- a call that times out closes its session (a server stuck on one call is not trusted with the next);
- sessions idle for WARDEN_MCP_SESSION_IDLE_SECONDS are closed, and at most MAX_SESSIONS are kept.

Sessions never cross servers: a server is a project's, and its key starts with the server's id.
"""

import asyncio
import concurrent.futures
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
from django.conf import settings

from .secrets import scrub

log = logging.getLogger("warden.tools")
MAX_SESSIONS = 32
STDERR_KEPT = 64 * 1024  # of what a stdio server writes on stderr, the end relayed to the log
SESSION_NOT_FOUND = "session not found"


class NotSent(Exception):
    """The call never reached the server (it could not be connected to, or it has no such session)."""


@dataclass(eq=False)
class _Session:
    key: str
    label: str  # "server <name> of project <id>", for the log
    secrets: tuple  # the values scrubbed from what its stderr relays
    ready: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    client: object = None
    closing: asyncio.Event = field(default_factory=asyncio.Event)  # bound to the loop when first awaited
    ended: BaseException | bool | None = None  # True when its transport ended, the holder's error when it failed
    last_used: float = field(default_factory=time.monotonic)
    busy: int = 0  # calls on it now: a session is never reaped under a call
    holder: concurrent.futures.Future | None = None  # the task that keeps it open, done when it has ended
    errlog: object = None
    relayed: int = 0
    relay_lock: threading.Lock = field(default_factory=threading.Lock)

    def usable(self) -> bool:
        return self.ended is None and self.ready.done() and self.ready.exception() is None


@asynccontextmanager
async def _watched(transport, session: _Session):
    """The transport, with its read stream relayed so that its end (a stdio server that died, a closed
    HTTP stream) marks the session ended before the next call is sent on it."""
    async with transport as (read, write):
        send, receive = anyio.create_memory_object_stream(0)

        async def relay():
            try:
                async with send:
                    async for item in read:
                        await send.send(item)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
                pass
            finally:
                session.ended = session.ended or True

        async with anyio.create_task_group() as group:
            group.start_soon(relay)
            try:
                yield receive, write
            finally:
                group.cancel_scope.cancel()


class _Pool:
    """One process's sessions and the event loop thread they live on."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.sessions: dict[str, _Session] = {}
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.loop.run_forever, name="mcp sessions", daemon=True)
        self.thread.start()

    def submit(self, coroutine) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    async def _hold(self, session: _Session, target_factory):
        from mcp import Client  # the SDK is large: imported by the processes that talk to a server only

        try:
            async with Client(_watched(target_factory(session.errlog), session), mode="legacy") as client:
                session.client = client
                session.ready.set_result(True)
                await session.closing.wait()
        except BaseException as exc:  # noqa: BLE001  (whatever ended it: the callers read it from the session)
            session.ended = exc
            if not session.ready.done():
                session.ready.set_exception(exc)
        finally:
            session.ended = session.ended or True
            _relay_stderr(session, final=True)

    def open(self, key: str, label: str, secrets: tuple, target_factory, stdio: bool, timeout: float) -> _Session:
        """The process's session for ``key``, opened (and waited for) when there is none alive."""
        with self.lock:
            self._reap()
            session = self.sessions.get(key)
            if session is not None and session.ready.done() and not session.usable():
                self._close(self.sessions.pop(key))
                session = None
            if session is None:
                session = _Session(key=key, label=label, secrets=secrets)
                session.errlog = tempfile.TemporaryFile("w+b") if stdio else None
                self.sessions[key] = session
                session.holder = self.submit(self._hold(session, target_factory))
        try:
            session.ready.result(timeout)
        except concurrent.futures.TimeoutError:
            self.drop(session)
            raise NotSent(f"no MCP session within {timeout:g}s") from None
        except BaseException as exc:  # noqa: BLE001  (it could not be opened: nothing was sent)
            self.drop(session)
            raise NotSent(_first_error(exc)) from None
        with self.lock:
            session.busy += 1  # the caller's call: it is not reaped under it (mcp_session_call releases it)
            session.last_used = time.monotonic()
        return session

    def drop(self, session: _Session) -> None:
        with self.lock:
            if self.sessions.get(session.key) is session:
                del self.sessions[session.key]
        self._close(session)

    def _close(self, session: _Session) -> None:
        self.loop.call_soon_threadsafe(session.closing.set)

    def _reap(self) -> None:
        """Under the lock: idle sessions closed, and the least recently used beyond MAX_SESSIONS."""
        idle = settings.WARDEN["MCP_SESSION_IDLE_SECONDS"]
        now = time.monotonic()
        by_use = sorted(self.sessions.values(), key=lambda s: s.last_used)
        for i, session in enumerate(by_use):
            if session.busy:
                continue
            if now - session.last_used > idle or len(by_use) - i > MAX_SESSIONS - 1:
                self._close(self.sessions.pop(session.key))

    def close_all(self, wait: float = 5.0) -> None:
        with self.lock:
            sessions = list(self.sessions.values())
            self.sessions.clear()
        for session in sessions:
            self._close(session)
        deadline = time.monotonic() + wait
        while any(s.ended is None and s.ready.done() for s in sessions) and time.monotonic() < deadline:
            time.sleep(0.01)


_pool: _Pool | None = None
_pool_lock = threading.Lock()


def _current() -> _Pool:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = _Pool()
        return _pool


def _forget_after_fork() -> None:
    """A forked child has none of its parent's threads: its sessions are its own, opened when needed."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def mcp_sessions_close() -> None:
    """Close this process's sessions (stdio servers stop): tests, and a process that is going away."""
    if _pool is not None:
        _pool.close_all()


def session_key(server_id: int, what: dict) -> str:
    """A digest of what a session was opened with; the secrets' values are in it, and stay in memory."""
    return f"{server_id}:" + hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def _first_error(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def _sent_bytes(exc: BaseException) -> bytes:
    try:
        return exc.request.content  # an httpx error's request
    except (AttributeError, RuntimeError):
        return b""


def _never_connected(exc: BaseException | bool | None, marker: str) -> bool:
    """Whether the session ended because its server could not be connected to, for this very call: every
    error a connection refused, one of them carrying the call's own request (``marker`` is in its body).
    Another request's refusal (a concurrent call's, the event stream's) proves nothing about this one."""
    if not isinstance(exc, BaseException):
        return False
    leaves = _leaves(exc)
    refused = all(type(e).__name__ in ("ConnectError", "ConnectTimeout") for e in leaves)
    return refused and any(marker.encode() in _sent_bytes(e) for e in leaves)


def _relay_stderr(session: _Session, final: bool = False) -> None:
    """What a stdio server wrote on stderr since the last relay, scrubbed (a server may print the
    credentials it was given), to the log; never straight into the worker's own stderr."""
    with session.relay_lock:
        _relay_locked(session, final)


def _relay_locked(session: _Session, final: bool) -> None:
    errlog = session.errlog
    if errlog is None or errlog.closed:
        return
    try:
        size = errlog.seek(0, os.SEEK_END)
        start = max(session.relayed, size - STDERR_KEPT)
        errlog.seek(start)
        text = errlog.read().decode(errors="replace")
        if start > session.relayed:  # its first line was cut: dropped whole, so no secret is left in halves
            text = text.partition("\n")[2]
        session.relayed = size
        if text.strip():
            said = scrub(text, session.secrets).strip()[-4000:]
            log.info("the MCP %s wrote on stderr:\n%s", session.label, said)
    finally:
        if final:
            errlog.close()


def mcp_session_call(
    *, key: str, label: str, secrets: tuple, target_factory, stdio: bool, use, marker: str, deadline: float
):
    """``use(client)``'s coroutine run on the process's session for ``key`` (opened with
    ``target_factory(errlog)`` when there is none alive), within ``deadline`` seconds. ``marker``: a string
    only this call's request carries (its idempotency key).

    Raises NotSent when the call never reached the server; any other exception means it may have."""
    pool = _current()
    started = time.monotonic()
    for attempt in (1, 2):
        session = pool.open(key, label, secrets, target_factory, stdio, timeout=_left(deadline, started))
        left = _left(deadline, started)
        future = pool.submit(use(session.client))
        try:
            try:
                return future.result(left)
            except concurrent.futures.TimeoutError:
                future.cancel()  # the call's task is cancelled on the loop; the session is closed below
                raise TimeoutError(f"no answer within {deadline:g}s") from None
        except BaseException as exc:
            if _untrusted(exc):
                pool.drop(session)
            if _closed_under(exc):
                concurrent.futures.wait([session.holder], timeout=2)  # why it closed: was the server reached?
            if _never_connected(session.ended, marker):
                raise NotSent(_first_error(session.ended)) from None
            if attempt == 1 and SESSION_NOT_FOUND in str(exc).lower():
                continue  # the server restarted and never ran it: once more, on a new session
            raise
        finally:
            with pool.lock:
                session.busy -= 1
            session.last_used = time.monotonic()
            if stdio:
                _relay_stderr(session)
    raise AssertionError("unreachable")  # pragma: no cover


def _left(deadline: float, started: float) -> float:
    return max(0.1, deadline - (time.monotonic() - started))


def _closed_under(exc: BaseException) -> bool:
    """The session closed while the call was on it (its holder is ending, and will say why)."""
    return isinstance(exc, concurrent.futures.CancelledError | asyncio.CancelledError) or "closed" in str(exc).lower()


def _untrusted(exc: BaseException) -> bool:
    """A session is not used again after a timeout or a broken transport; a protocol error (bad arguments,
    an unknown tool) keeps it. A tool's own error is an answer, not an exception."""
    said = str(exc).lower()
    return type(exc).__name__ != "MCPError" or "closed" in said or SESSION_NOT_FOUND in said
