"""The dashboard's websockets (dashboard/consumers.py) and what dashboard/live.py publishes through them: who may
open one, hellos and pushes with their sequence numbers, nothing before commit or after a rollback,
access lost while connected, and the runs list's per-project groups. Both channel layers: the in-memory
one (embedded) and channels-redis (scaled, REDIS_URL set).

pytest-asyncio is not installed: each test is a coroutine run by ``asgiref``'s ``async_to_sync``, and
ORM calls inside it go through ``database_sync_to_async`` (they run in the test's thread, on its
connection)."""

import functools
import json

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.sessions.models import Session
from django.core.cache import cache
from django.db import transaction
from django.test import Client
from django.utils import timezone

from config.asgi import application
from core import bus
from dashboard import live, presence
from dashboard.consumers import DENIED, InboxConsumer, RunConsumer, RunListConsumer
from runs.models import Span
from tenancy.access import default_project, membership_grant, membership_revoke
from tenancy.models import Project
from tests.runs.test_run_page import build_run

ORIGIN = "http://127.0.0.1:8000"


def run_async(test):
    """Run an async test body to completion in an event loop of its own."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        return async_to_sync(test)(*args, **kwargs)

    return wrapper


def db(fn, *args, **kwargs):
    return database_sync_to_async(fn)(*args, **kwargs)


def session_of(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def socket(path: str, *, session: str | None = None, origin: str = ORIGIN) -> WebsocketCommunicator:
    headers = [(b"origin", origin.encode()), (b"host", b"127.0.0.1:8000")]
    if session:
        headers.append((b"cookie", f"sessionid={session}".encode()))
    return WebsocketCommunicator(application, path, headers=headers)


async def received(communicator, timeout: float = 5) -> dict:
    """The next message that is not a heartbeat."""
    while True:
        message = json.loads(await communicator.receive_from(timeout=timeout))
        if not message.get("beat"):
            return message


def change(run, *, new_span: bool = True, fail: bool = False) -> int | None:
    """A committed (or, with ``fail``, rolled-back) change of the run, as a service makes one."""
    try:
        with transaction.atomic():
            span = None
            if new_span:
                attempt = Span.objects.filter(run=run, kind=Span.Kind.ATTEMPT).order_by("id").first()
                span = Span.objects.create(
                    run=run, task_id=attempt.task_id, parent=attempt, kind=Span.Kind.TOOL_CALL, name="crm.read",
                    started_at=timezone.now(), ended_at=timezone.now(),
                )  # fmt: skip
            bus.run_changed(run.id)
            if fail:
                raise RuntimeError("rolled back")
    except RuntimeError:
        return None
    return span.id if span else None


def publish():
    live.publisher.flush()


@pytest.fixture
def people(transactional_db, django_user_model):
    """olivia (operator of the default project) and otto (admin of another project only)."""
    olivia = django_user_model.objects.create_user(username="olivia", password="operator-pass-123")
    membership_grant(user=olivia, project=default_project(), role="operator")
    otto = django_user_model.objects.create_user(username="otto", password="outsider-pass-123")
    elsewhere = Project.objects.create(slug="elsewhere", name="Elsewhere")
    membership_grant(user=otto, project=elsewhere, role="admin")
    return olivia, otto, elsewhere


@pytest.fixture
def run(transactional_db):
    run = build_run(2, calls=2)
    cache.delete(f"mark:run:{run.id}")  # ids repeat between tests on SQLite; the cache outlives them
    return run


# --- who may connect -------------------------------------------------------------------------------------
@run_async
async def test_the_socket_refuses_anonymous_foreign_origins_outsiders_and_unknown_runs(people, run):
    olivia, otto, _ = people
    olivia_session, otto_session = await db(session_of, olivia), await db(session_of, otto)
    cases = {
        "anonymous": socket(f"/ws/runs/{run.id}/"),
        "foreign origin": socket(f"/ws/runs/{run.id}/", session=olivia_session, origin="https://evil.example"),
        "not a member": socket(f"/ws/runs/{run.id}/", session=otto_session),
        "no such run": socket(f"/ws/runs/{run.id + 1000}/", session=olivia_session),
        "a session that does not exist": socket(f"/ws/runs/{run.id}/", session="0" * 32),
    }
    for name, communicator in cases.items():
        if name == "foreign origin":  # the origin check refuses the handshake before any consumer runs
            assert (await communicator.connect(timeout=5))[0] is False
        else:
            assert await refusal(communicator) == DENIED, name
        await communicator.disconnect()
    lists = socket("/ws/runs/", origin="https://evil.example", session=olivia_session)
    assert (await lists.connect(timeout=5))[0] is False
    assert await refusal(socket("/ws/runs/")) == DENIED


async def refusal(communicator) -> int | None:
    """The close code of a refused socket: accepted, then closed at once with our code (a refused
    handshake would reach the browser as 1006 and look like a network failure worth retrying)."""
    connected, code = await communicator.connect(timeout=5)
    if not connected:
        return code
    message = await communicator.receive_output(timeout=5)
    assert message["type"] == "websocket.close", message
    return message.get("code")


# --- hello and pushes ----------------------------------------------------------------------------------------
@run_async
async def test_a_member_gets_a_hello_then_each_committed_change_with_the_next_number(people, run):
    olivia, _, _ = people
    communicator = socket(f"/ws/runs/{run.id}/", session=await db(session_of, olivia))
    assert await communicator.connect(timeout=5) == (True, None)
    hello = await received(communicator)
    assert hello["hello"] is True
    seq = hello["seq"]
    assert seq == await db(presence.seq_current, presence.run_seq_name(run.id))

    await db(change, run)
    await db(publish)
    first = await received(communicator)
    # No watermark yet (the first push since a viewer appeared): the page is told to re-read.
    assert first == {"seq": seq + 1, "refetch": True}

    span_id = await db(change, run)
    await db(publish)
    second = await received(communicator)
    assert second["seq"] == seq + 2 and "refetch" not in second
    assert f'<li id="node-{span_id}"' in second["html"] and 'id="run-header"' in second["html"]

    # A rolled-back transaction publishes nothing.
    assert await db(change, run, fail=True) is None
    await db(publish)
    assert await communicator.receive_nothing(timeout=0.5)

    # A change made while a transaction is still open leaves only when it commits. (sync_to_async,
    # not database_sync_to_async: that one closes a connection it finds inside a transaction.)
    outer = transaction.atomic()
    await sync_to_async(outer.__enter__)()
    try:
        span_id = await sync_to_async(change)(run)
        await sync_to_async(publish)()
        assert await communicator.receive_nothing(timeout=0.5)
    finally:
        await sync_to_async(outer.__exit__)(None, None, None)
    await db(publish)
    third = await received(communicator)
    assert third["seq"] == seq + 3 and f'<li id="node-{span_id}"' in third["html"]
    await communicator.disconnect()


def test_the_push_is_registered_on_commit_once_per_transaction_and_dropped_on_rollback(
    db, django_capture_on_commit_callbacks, monkeypatch
):
    pushed = []
    monkeypatch.setattr(live.publisher, "push", pushed.append)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        with transaction.atomic():
            bus.run_changed(7)
            bus.run_changed(7)  # the same run twice in one transaction: one push
            bus.run_changed(8)
        assert pushed == []  # committed (a savepoint here), but the outer transaction is still open
    assert len(callbacks) == 2
    for callback in callbacks:
        callback()
    assert pushed == [7, 8]

    pushed.clear()
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        try:
            with transaction.atomic():
                bus.run_changed(9)
                raise RuntimeError("rolled back")
        except RuntimeError:
            pass
    assert callbacks == [] and pushed == []


# --- access lost while connected ---------------------------------------------------------------------------------
@run_async
async def test_revoking_the_membership_closes_the_open_socket(people, run):
    olivia, _, _ = people
    communicator = socket(f"/ws/runs/{run.id}/", session=await db(session_of, olivia))
    assert (await communicator.connect(timeout=5))[0]
    await received(communicator)
    await db(lambda: membership_revoke(user=olivia, project=default_project()))
    await db(publish)
    while True:
        output = await communicator.receive_output(timeout=5)
        if output["type"] == "websocket.close":
            break
        assert json.loads(output["text"]).get("beat") or "refetch" in output["text"]
    assert output["code"] == DENIED
    await communicator.disconnect()


@run_async
async def test_logging_out_closes_the_socket_at_the_next_check(people, run, monkeypatch):
    olivia, _, _ = people
    monkeypatch.setattr(RunConsumer, "beat_seconds", 0.2)
    session = await db(session_of, olivia)
    communicator = socket(f"/ws/runs/{run.id}/", session=session)
    assert (await communicator.connect(timeout=5))[0]
    assert (await received(communicator))["hello"]
    beat = json.loads(await communicator.receive_from(timeout=5))
    assert beat["beat"] is True and beat["seq"] >= 0  # still allowed: the heartbeat carries the number
    await db(lambda: Session.objects.filter(session_key=session).delete())
    while True:
        output = await communicator.receive_output(timeout=5)
        if output["type"] == "websocket.close":
            break
    assert output["code"] == DENIED
    await communicator.disconnect()


# --- the runs list ---------------------------------------------------------------------------------------------
@run_async
async def test_the_runs_list_socket_hears_only_the_users_projects(people, run, monkeypatch):
    olivia, _, elsewhere = people
    theirs = await db(build_run, 2, calls=2, project=elsewhere)
    monkeypatch.setattr(RunListConsumer, "beat_seconds", 60)
    communicator = socket("/ws/runs/", session=await db(session_of, olivia))
    assert await communicator.connect(timeout=5) == (True, None)
    hello = await received(communicator)
    mine = str(run.project_id)
    assert hello["hello"] is True and set(hello["seqs"]) == {mine}

    await db(change, theirs)
    await db(publish)
    assert await communicator.receive_nothing(timeout=0.5)  # another project's run: never sent here

    await db(change, run)
    await db(publish)
    push = await received(communicator)
    assert push["project"] == run.project_id and push["seq"] == hello["seqs"][mine] + 1
    assert f'<tr id="run-row-{run.id}"' in push["html"] and f"run-row-{theirs.id}" not in push["html"]

    # Membership revoked while connected: the socket leaves that project's group at once.
    await db(lambda: membership_revoke(user=olivia, project=default_project()))
    await db(publish)
    assert await communicator.receive_nothing(timeout=0.5)  # the socket stays open; it re-checks meanwhile
    await db(change, run)
    await db(publish)
    assert await communicator.receive_nothing(timeout=0.5)
    await communicator.disconnect()


# --- the nav's "needs you" count ------------------------------------------------------------------------------
@run_async
async def test_the_inbox_socket_nudges_only_members_of_the_changed_runs_project(people, run, monkeypatch):
    olivia, otto, elsewhere = people
    theirs = await db(build_run, 2, calls=2, project=elsewhere)
    monkeypatch.setattr(InboxConsumer, "beat_seconds", 60)
    mine, other = (
        socket("/ws/inbox/", session=await db(session_of, olivia)),
        socket("/ws/inbox/", session=await db(session_of, otto)),
    )
    for communicator in (mine, other):
        assert await communicator.connect(timeout=5) == (True, None)
        assert (await received(communicator))["hello"] is True
    await db(change, run)
    await db(publish)
    assert (await received(mine)) == {"inbox": run.project_id}  # a nudge: no content, the count is fetched
    assert await other.receive_nothing(timeout=0.5)
    await db(change, theirs)
    await db(publish)
    assert (await received(other)) == {"inbox": elsewhere.id}
    assert await mine.receive_nothing(timeout=0.5)
    anonymous = socket("/ws/inbox/")
    assert await anonymous.connect(timeout=5) == (True, None)
    assert (await anonymous.receive_output(timeout=5))["code"] == DENIED
    for communicator in (mine, other):
        await communicator.disconnect()
