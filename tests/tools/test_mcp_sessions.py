"""MCP sessions kept per process and server (tools/mcp_sessions.py): the official SDK's example server
(examples/refunds/tickets_mcp.py) started for real, over stdio and streamable HTTP, called through the
MCP tool's execute as the broker calls it. The server writes its process id with every effect: that is
how these tests see whether a call was served by the same process."""

import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest
from django.db import connections

from tenancy.access import default_project
from tenancy.models import Project
from tests.conftest import free_port, wait_for
from tests.tools.test_mcp_tools import EXAMPLE, effects, effects_file, stdio_server  # noqa: F401  (the fixture)
from tools.kit import ToolTimeout, ToolUnavailable
from tools.mcp_tools import _execute, mcp_list, mcp_tools_store
from tools.models import McpServer, McpTool

# The sessions live in the process, apart from the database: the same in either mode (the embedded half runs them).
pytestmark = pytest.mark.anymode


def create(server: McpServer, title: str, key: str) -> dict:
    row = McpTool.objects.select_related("server").get(server=server, remote_name="create_ticket")
    return _execute(row, {"title": title}, key=key, deadline=20, secrets={})


def pids(path) -> list[int]:
    return [e["pid"] for e in effects(path)]


def reaped(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_stdio_server_is_started_once_per_process_and_again_after_it_died(db, effects_file):  # noqa: F811
    server = stdio_server()
    started = time.perf_counter()
    for n in range(5):
        create(server, f"t{n}", key=f"k{n}")
    assert len(set(pids(effects_file))) == 1, "five calls, one server process"
    assert time.perf_counter() - started < 5  # not five server starts of a Python process each

    [pid] = set(pids(effects_file))
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: reaped(pid), message="the killed server to be reaped")
    time.sleep(0.2)  # its end is seen on the session's read stream as it exits
    ticket = create(server, "after the crash", key="k5")  # not ambiguous: nothing was sent to the dead one
    assert ticket["id"].startswith("TCK-")
    assert pids(effects_file)[-1] not in (pid, None) and len(effects(effects_file)) == 6


def test_servers_of_two_projects_never_share_a_process(db, effects_file):  # noqa: F811
    """The same command, two projects: a project's server never serves another project's calls."""
    ours = stdio_server()
    theirs = McpServer.objects.create(project=Project.objects.create(slug="theirs", name="Theirs"), name="helpdesk",
                                      transport="stdio", command="tickets", timeout_seconds=20)  # fmt: skip
    mcp_tools_store(theirs, mcp_list(theirs))
    create(ours, "ours", key="a")
    create(theirs, "theirs", key="b")
    create(ours, "ours again", key="c")
    first, second, third = pids(effects_file)
    assert first == third != second


def _child_call(server_id: int, queue) -> None:
    server = McpServer.objects.get(id=server_id)
    try:
        queue.put(create(server, "from the child", key="child"))
    except BaseException as exc:  # noqa: BLE001  (reported to the parent)
        queue.put(repr(exc))


@pytest.mark.django_db(transaction=True)
def test_a_forked_child_opens_its_own_session_and_leaves_its_parents_alone(effects_file):  # noqa: F811
    server = stdio_server()
    create(server, "parent", key="p1")
    connections.close_all()  # the child opens its own connection to read the server's row
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_call, args=(server.id, queue))
    child.start()
    answer = queue.get(timeout=60)
    child.join(30)
    assert isinstance(answer, dict), answer
    create(server, "parent again", key="p2")
    parent, from_child, parent_again = pids(effects_file)
    assert parent == parent_again != from_child  # the parent's server outlived the child, unshared


@pytest.fixture
def restartable(effects_file):  # noqa: F811
    port = free_port()
    procs = []

    def start():
        proc = subprocess.Popen([sys.executable, str(EXAMPLE), "--http", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        procs.append(proc)
        return proc

    def answers(server):
        try:
            return mcp_list(server)
        except Exception:  # noqa: BLE001  (not up yet)
            return None

    yield port, start, answers
    for proc in procs:
        proc.kill()
        proc.wait()


def test_an_http_server_that_restarted_gets_the_call_once_on_a_new_session(db, restartable, effects_file):  # noqa: F811
    port, start, answers = restartable
    server = McpServer.objects.create(project=default_project(), name="helpdesk", transport="http",
                                      url=f"http://127.0.0.1:{port}/mcp", timeout_seconds=20)  # fmt: skip
    first = start()
    mcp_tools_store(server, wait_for(lambda: answers(server), timeout=30, interval=0.2, message="the server"))
    create(server, "one", key="k1")
    create(server, "two", key="k2")
    first.kill()
    first.wait()
    with pytest.raises(ToolUnavailable):  # down: refused at the connection, so it was never sent
        create(server, "while down", key="k3")
    start()
    wait_for(lambda: answers(server), timeout=30, interval=0.2, message="the restarted server")
    create(server, "three", key="k4")  # its old session is unknown to it: "Session not found", then a new one
    titles = [e["title"] for e in effects(effects_file)]
    assert titles == ["one", "two", "three"]
    assert len(set(pids(effects_file)[:2])) == 1 and pids(effects_file)[2] != pids(effects_file)[0]


def test_a_call_that_times_out_is_ambiguous_and_its_session_is_not_used_again(db, effects_file, monkeypatch):  # noqa: F811
    server = stdio_server()
    create(server, "warm", key="w")
    [pid] = pids(effects_file)
    os.kill(pid, signal.SIGSTOP)  # alive, and silent
    try:
        row = McpTool.objects.select_related("server").get(server=server, remote_name="create_ticket")
        with pytest.raises(ToolTimeout):
            _execute(row, {"title": "stuck"}, key="s", deadline=1, secrets={})
    finally:
        os.kill(pid, signal.SIGCONT)
    create(server, "after", key="a")
    assert pids(effects_file)[-1] != pid  # a new server answered: the stuck one's session was closed


def test_an_idle_session_is_closed_and_the_next_call_opens_another(db, effects_file, settings):  # noqa: F811
    server = stdio_server()
    create(server, "first", key="a")
    settings.WARDEN = {**settings.WARDEN, "MCP_SESSION_IDLE_SECONDS": 0}
    time.sleep(0.05)
    create(server, "second", key="b")
    first, second = pids(effects_file)
    assert first != second
    wait_for(lambda: reaped(first), message="the idle server to stop")
