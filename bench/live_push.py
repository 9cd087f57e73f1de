"""Dashboard benchmark on PostgreSQL + Redis: live pushes, the engine with viewers, page renders.

Prints each figure next to a reference measured in the same run:
  (1) push latency to 50 websocket viewers of one run, from the commit of a change (a span inserted in
      a transaction that calls dashboard.live.run_changed) to its arrival on each socket, p50/p99, and the
      pushes lost — against a bare channel_layer.group_send to the same 50 sockets;
  (2) engine steps/s with 50 viewers on the runs being executed, against the same workload unwatched;
  (3) the server-side render of a run page of 10,000 tasks / 100,000 spans (and its query count);
  (4) the runs list (first page, a status filter, a deep keyset page) over 1,000,000 runs;
and the resident memory of the ASGI server and the worker processes.

    .venv/bin/python bench/live_push.py [--viewers 50] [--events 200] [--runs-list 1000000] [--quick] [--json]

It creates its own database (`warden_bench_dash` by default; dropped at the end unless --keep), starts
its own ASGI server (`manage.py serve`, scaled mode) and `rundramatiq` workers, and stops them itself.
The websocket clients run in a child process (this file with --viewer-child), so the browsers' work is
not done by the process that commits and publishes.
"""

import argparse
import json
import os
import random
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/warden_bench_dash"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"
CHANNELS_PREFIX = "warden:channels"  # config/settings/base.py CHANNEL_LAYERS

SEQ = re.compile(r'^\{"seq": (-?\d+)')
MARK = re.compile(r"evt(\d{6})x")
BARE = re.compile(r'"bare": (\d+)')


# --- the browsers: a child process holding the websockets ---------------------------------------------------
def viewer_child(args) -> None:
    """Open the sockets, say `ready`, then answer `dump` (records so far, one JSON line) and `quit` on stdin.

    A record is [arrival (time.monotonic, system-wide), socket, seq, kind, [event markers]]; the text itself is
    not kept. kind: hello, beat, html, refetch, bare, other, closed."""
    import asyncio

    from websockets.asyncio.client import connect

    targets = [int(x) for x in args.targets.split(",")]
    cookie = os.environ["BENCH_SESSIONID"]
    records: list = []
    stats = {"bytes": 0, "messages": 0}

    async def one(idx: int, run_id: int, gate: asyncio.Semaphore, ready: list):
        async with gate:
            ws = await connect(
                f"ws://127.0.0.1:{args.port}/ws/runs/{run_id}/",
                origin=f"http://127.0.0.1:{args.port}",
                additional_headers={"Cookie": f"sessionid={cookie}"},
                proxy=None,
                compression=None,
                max_size=None,
                ping_interval=None,
                open_timeout=30,
            )
            hello = json.loads(await ws.recv())
            if not hello.get("hello"):
                raise SystemExit(f"socket {idx}: expected a hello, got {hello}")
            ready.append(idx)
        try:
            async for text in ws:
                t = time.monotonic()
                stats["messages"] += 1
                stats["bytes"] += len(text)
                m = SEQ.match(text)
                seq = int(m.group(1)) if m else None
                head = text[:80]
                if '"bare"' in head:
                    records.append([t, idx, seq, "bare", [int(BARE.search(text).group(1))]])
                elif '"html"' in text:
                    records.append([t, idx, seq, "html", [int(x) for x in MARK.findall(text)]])
                elif '"refetch"' in head:
                    records.append([t, idx, seq, "refetch", []])
                elif '"beat"' in head:
                    records.append([t, idx, seq, "beat", []])
                else:
                    records.append([t, idx, seq, "other", []])
        except Exception:
            pass
        records.append([time.monotonic(), idx, ws.close_code, "closed", []])
        return ws

    async def main():
        gate = asyncio.Semaphore(10)
        ready: list = []
        tasks = [asyncio.create_task(one(i, run_id, gate, ready)) for i, run_id in enumerate(targets)]
        deadline = time.monotonic() + 60
        while len(ready) < len(targets):
            failed = [t for t in tasks if t.done() and t.exception()]
            if failed:
                raise failed[0].exception()
            if time.monotonic() > deadline:
                raise SystemExit(f"only {len(ready)} of {len(targets)} sockets connected")
            await asyncio.sleep(0.05)
        print(f"ready {len(ready)}", flush=True)
        loop = asyncio.get_running_loop()
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
            if line == "dump":
                out, records[:] = list(records), []
                print(json.dumps({"records": out, **stats}), flush=True)
            elif line in ("quit", ""):
                break
        for t in tasks:
            t.cancel()

    asyncio.run(main())


class Viewers:
    """The child process of websockets, seen from the benchmark."""

    def __init__(self, port: int, sessionid: str, targets: list[int]):
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--viewer-child", "--port", str(port), "--targets", ",".join(map(str, targets))],
            cwd=ROOT,
            env=dict(os.environ, BENCH_SESSIONID=sessionid, PYTHONUNBUFFERED="1"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=False,
            start_new_session=True,
        )
        self._buf = b""
        with stopped_on_failure(self.proc):
            line = self._line(90)
            if not line.startswith("ready"):
                raise SystemExit(f"viewers did not connect: {line!r}")
        self.count = int(line.split()[1])

    def _line(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None and not select.select([fd], [], [], 0)[0]:
                raise SystemExit(f"the viewer process did not answer (exit code {self.proc.poll()})")
            if select.select([fd], [], [], min(left, 0.5))[0]:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise SystemExit(f"the viewer process ended (exit code {self.proc.wait()})")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def dump(self) -> dict:
        self.proc.stdin.write(b"dump\n")
        self.proc.stdin.flush()
        return json.loads(self._line(60))

    def cpu(self) -> float:
        return cpu_seconds([self.proc.pid])

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b"quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                pass
        kill_group(self.proc)


# --- processes -----------------------------------------------------------------------------------------------
def kill_group(proc: subprocess.Popen, grace: float = 10) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGCONT)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def cpu_seconds(pids) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except FileNotFoundError:
            pass
    return total


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def manage(args: list[str], log_path: Path) -> subprocess.Popen:
    log = open(log_path, "w")
    return subprocess.Popen(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def server_start(port: int, log_path: Path) -> subprocess.Popen:
    import urllib.request

    proc = manage(["serve", "--port", str(port)], log_path)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + 60
    with stopped_on_failure(proc):
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"the ASGI server exited; see {log_path}")
            try:
                opener.open(f"http://127.0.0.1:{port}/login/", timeout=2).read()
                return proc
            except OSError:
                time.sleep(0.2)
        raise SystemExit(f"the ASGI server did not answer; see {log_path}")


def workers_start(processes: int, threads: int, log_path: Path) -> subprocess.Popen:
    proc = manage(["rundramatiq", "--processes", str(processes), "--threads", str(threads)], log_path)
    deadline = time.monotonic() + 30
    with stopped_on_failure(proc):
        while len(children(proc.pid)) < processes and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)  # let the workers declare their queues and boot
        if proc.poll() is not None:
            raise SystemExit(f"the workers exited; see {log_path}")
    return proc


def best_effort(what: str, cleanup, *args, attempts: int = 5) -> None:
    """A clean-up step that must not stop the next one: PostgreSQL or Redis may be restarting (a drill,
    or the reason the benchmark failed). Tried a few times, then reported."""
    for attempt in range(attempts):
        try:
            cleanup(*args)
            return
        except Exception as exc:
            if attempt == attempts - 1:
                print(f"could not {what}: {exc!r:.300}", file=sys.stderr, flush=True)
            else:
                time.sleep(2)


@contextmanager
def stopped_on_failure(proc: subprocess.Popen):
    """A process being started is stopped if starting it fails or is interrupted (SIGTERM, Ctrl-C):
    the caller never got it, so nobody else would."""
    try:
        yield
    except BaseException:
        kill_group(proc)
        raise


# --- database ------------------------------------------------------------------------------------------------
def db_admin(url: str):
    import psycopg

    parts = urlparse(url)
    return psycopg.connect(
        host=parts.hostname,
        port=parts.port or 5432,
        user=parts.username or "postgres",
        dbname="postgres",
        autocommit=True,
    )


def db_create(url: str) -> None:
    name = urlparse(url).path.lstrip("/")
    with db_admin(url) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')


def db_drop(url: str) -> None:
    name = urlparse(url).path.lstrip("/")
    with db_admin(url) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- statistics ----------------------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def seq_gaps(per_socket: dict) -> int:
    """Jumps in the sequence numbers each socket received: a browser re-renders the page on each."""
    return sum(sum(1 for a, b in zip(s, s[1:], strict=False) if b != a + 1) for s in per_socket.values())


def p50_p99(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), pct(values, 0.99)


# --- fixtures ------------------------------------------------------------------------------------------------
def superuser_session():
    """A superuser, and a logged-in django.test.Client (its session row is what the sockets present)."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.create_superuser("bench", "bench@example.invalid", "bench-pass-123")
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    return user, client, client.cookies["sessionid"].value


def bench_agents_and_workflows(steps: int):
    from agents.models import Agent, Workflow

    long = Agent.objects.create(
        slug="bench-dash-long",
        name="long",
        script=[{"say": "step {turn}", "repeat": steps - 1}, {"final": {"done": True}}],
    )
    Workflow.objects.create(
        slug="bench-dash-long", name="long", tasks=[{"key": "t", "agent": long.slug, "objective": "go"}]
    )
    return long


def bare_run(workflow, agent, project, user):
    """A running run with one running task and its open task and attempt spans; no message is sent."""
    from django.utils import timezone

    from runs.models import Run, Span, Task

    now = timezone.now()
    run = Run.objects.create(
        workflow=workflow,
        project=project,
        goal="push latency",
        status=Run.Status.RUNNING,
        started_at=now,
        started_by=user,
        code_version="bench",
    )
    root = Span.objects.create(run=run, kind="run", name="run bench", status="running", started_at=now)
    task = Task.objects.create(
        run=run, key="t", agent=agent, objective="push", status=Task.Status.RUNNING, attempts=1, started_at=now
    )
    tspan = Span.objects.create(
        run=run, task=task, parent=root, kind="task", name="t", status="running", started_at=now
    )
    attempt = Span.objects.create(
        run=run, task=task, parent=tspan, kind="attempt", name="attempt 1", attempt=1, status="running", started_at=now
    )
    return run, task, attempt


# --- (1) push latency ------------------------------------------------------------------------------------------
def push_latency(args, port: int, sessionid: str, fixtures, proc_server) -> dict:
    import asyncio

    from channels.layers import get_channel_layer
    from django.db import transaction
    from django.utils import timezone

    import dashboard.views.run_page as run_page
    from dashboard import live, presence
    from runs.models import Run, Task
    from runs.services import sql

    workflow, agent, project, user = fixtures
    run, task, attempt = bare_run(workflow, agent, project, user)

    # Instrument the publisher in this process (the bench is a publisher like any worker): time spent
    # rendering a push and sending it to the group.
    timings = {"render": [], "send": []}
    real_push, real_send = run_page.run_push, live.publisher.send

    def timed_push(run_id):
        t = time.perf_counter()
        try:
            return real_push(run_id)
        finally:
            timings["render"].append(time.perf_counter() - t)

    def timed_send(group, text, kind="push"):
        t = time.perf_counter()
        try:
            return real_send(group, text, kind)
        finally:
            timings["send"].append((time.perf_counter() - t, len(text)))

    run_page.run_push, live.publisher.send = timed_push, timed_send

    viewers = Viewers(port, sessionid, [run.id] * args.viewers)
    try:
        interval = 1 / args.rate
        layer = get_channel_layer()
        loop = asyncio.new_event_loop()
        group = presence.run_group(run.id)
        cpu_server0, cpu_view0 = cpu_seconds([proc_server.pid]), viewers.cpu()

        # Reference: a bare group_send of a tiny message to the same sockets.
        sent = {}
        t0 = time.monotonic()
        for i in range(args.events):
            time.sleep(max(0.0, t0 + i * interval - time.monotonic()))
            text = json.dumps({"seq": -1, "bare": i})
            sent[i] = time.monotonic()
            loop.run_until_complete(layer.group_send(group, {"type": "push", "text": text}))
        time.sleep(2)
        bare_records = viewers.dump()["records"]
        cpu_server_bare, cpu_view_bare = cpu_seconds([proc_server.pid]) - cpu_server0, viewers.cpu() - cpu_view0

        # Warm-up: the first push after a viewer arrives is a "refetch" (no watermark yet).
        def change(i: int, stamps: dict):
            with transaction.atomic():
                transaction.on_commit(lambda: stamps.__setitem__(i, time.monotonic()))
                sql.insert_span(
                    run_id=run.id,
                    task_id=task.id,
                    parent_id=attempt.id,
                    kind="tool_call",
                    name=f"crm.read evt{i:06d}x",
                    step=i + 1,
                    attempt=1,
                    started_at=timezone.now(),
                    ended_at=timezone.now(),
                    attributes={"tool": "crm.read"},
                    body={"ok": True, "record": {"id": f"cust-{i}"}},
                )

        warm: dict = {}
        for i in range(3):
            change(900_000 + i, warm)
            live.publisher.flush()
            time.sleep(0.2)
        time.sleep(1)
        viewers.dump()
        for key in timings:
            timings[key].clear()
        cpu_server1, cpu_view1, cpu_self1 = cpu_seconds([proc_server.pid]), viewers.cpu(), time.process_time()

        committed: dict = {}
        t0 = time.monotonic()
        for i in range(args.events):
            time.sleep(max(0.0, t0 + i * interval - time.monotonic()))
            change(i, committed)
        live.publisher.flush()
        time.sleep(3)
        dash = viewers.dump()
        cpu_server_dash = cpu_seconds([proc_server.pid]) - cpu_server1
        cpu_view_dash = viewers.cpu() - cpu_view1
        cpu_self_dash = time.process_time() - cpu_self1
    finally:
        viewers.stop()
        run_page.run_push, live.publisher.send = real_push, real_send
        Run.objects.filter(id=run.id).update(status=Run.Status.COMPLETED, finished_at=timezone.now())
        Task.objects.filter(id=task.id).update(status=Task.Status.COMPLETED, finished_at=timezone.now())

    n_sockets = viewers.count
    bare_lat, bare_seen = [], set()
    for t, idx, _seq, kind, marks in bare_records:
        if kind == "bare" and (marks[0], idx) not in bare_seen:
            bare_seen.add((marks[0], idx))
            bare_lat.append((t - sent[marks[0]]) * 1000)
    dash_lat, dash_seen = [], set()
    pushes, seqs, refetches = 0, {}, 0
    for t, idx, seq, kind, marks in dash["records"]:
        if kind in ("html", "refetch"):
            pushes += 1
            seqs.setdefault(idx, []).append(seq)
            refetches += kind == "refetch"
        for m in marks:
            if m in committed and (m, idx) not in dash_seen:
                dash_seen.add((m, idx))
                dash_lat.append((t - committed[m]) * 1000)
    gaps = seq_gaps(seqs)
    closed = sum(1 for r in dash["records"] + bare_records if r[3] == "closed")
    render = [x * 1000 for x in timings["render"]]
    send = [x * 1000 for x, _ in timings["send"]]
    size = statistics.median([n for _, n in timings["send"]]) if timings["send"] else 0
    return {
        "sockets": n_sockets,
        "events": args.events,
        "bare": p50_p99(bare_lat),
        "bare_lost": args.events * n_sockets - len(bare_seen),
        "dash": p50_p99(dash_lat) if dash_lat else (float("nan"), float("nan")),
        "dash_lost": args.events * n_sockets - len(dash_seen),
        "pushes_per_socket": pushes / max(n_sockets, 1),
        "gaps": gaps,
        "refetches": refetches,
        "closed": closed,
        "render": p50_p99(render) if render else (0, 0),
        "send": p50_p99(send) if send else (0, 0),
        "push_bytes": size,
        "cpu_server_bare": cpu_server_bare,
        "cpu_server_dash": cpu_server_dash,
        "cpu_viewers_bare": cpu_view_bare,
        "cpu_viewers_dash": cpu_view_dash,
        "cpu_bench_dash": cpu_self_dash,
    }


# --- (2) engine with and without viewers ---------------------------------------------------------------------
def engine_with_viewers(args, port: int, sessionid: str, log_dir: Path) -> dict:
    from django.utils import timezone

    from runs.models import Run
    from runs.services import run_start

    def wait_done(run_ids, timeout=600):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            statuses = list(Run.objects.filter(id__in=run_ids).values_list("status", flat=True))
            if all(s in Run.TERMINAL or s == Run.Status.NEEDS_ATTENTION for s in statuses):
                bad = [s for s in statuses if s != Run.Status.COMPLETED]
                if bad:
                    raise SystemExit(f"benchmark runs did not complete: {bad[:5]}")
                return
            time.sleep(0.05)
        raise SystemExit("benchmark runs did not finish in time")

    workers = workers_start(args.processes, args.threads, log_dir / "workers.log")
    pids = [workers.pid, *children(workers.pid)]
    results = {"none": [], "viewers": []}
    extra = {"pushes": [], "gaps": [], "refetches": [], "cpu_viewers": [], "cpu_server": [], "cpu_workers": {}}
    try:
        order = ["none", "viewers"] * args.repeat
        for mode in order:
            viewers = None
            os.killpg(workers.pid, signal.SIGSTOP)  # the runs wait in the queue while their viewers connect
            try:
                run_ids = [run_start(workflow="bench-dash-long").id for _ in range(args.engine_runs)]
                if mode == "viewers":
                    targets = [run_ids[i % len(run_ids)] for i in range(args.viewers)]
                    viewers = Viewers(port, sessionid, targets)
            finally:
                cpu0, cpu_srv0 = cpu_seconds(pids), cpu_seconds([SERVER_PID[0]])
                cpu_view0 = viewers.cpu() if viewers else 0
                t0 = timezone.now()
                os.killpg(workers.pid, signal.SIGCONT)
            try:
                wait_done(run_ids)
                runs = list(Run.objects.filter(id__in=run_ids))
                wall = (max(r.finished_at for r in runs) - t0).total_seconds()
                steps = sum(r.steps_used for r in runs)
                results[mode].append(steps / wall)
                extra["cpu_workers"].setdefault(mode, []).append((cpu_seconds(pids) - cpu0) / steps * 1000)
                if viewers:
                    time.sleep(1)
                    got = viewers.dump()
                    extra["cpu_viewers"].append(viewers.cpu() - cpu_view0)
                    extra["cpu_server"].append(cpu_seconds([SERVER_PID[0]]) - cpu_srv0)
                    per: dict = {}
                    for _t, idx, seq, kind, _m in got["records"]:
                        if kind in ("html", "refetch"):
                            per.setdefault(idx, []).append(seq)
                    extra["pushes"].append(sum(len(s) for s in per.values()) / max(len(per), 1))
                    extra["gaps"].append(seq_gaps(per))
                    extra["refetches"].append(sum(1 for r in got["records"] if r[3] == "refetch"))
            finally:
                if viewers:
                    viewers.stop()
            print(f"    {mode:8} {results[mode][-1]:,.0f} steps/s ({steps} steps in {wall:.2f} s)", flush=True)
        memory = {"workers": [(pid, rss_mb(pid)) for pid in pids if Path(f"/proc/{pid}").exists()]}
    finally:
        kill_group(workers, grace=20)
    return {
        "none": statistics.median(results["none"]),
        "viewers": statistics.median(results["viewers"]),
        "all": results,
        "pushes": statistics.median(extra["pushes"]),
        "gaps": statistics.median(extra["gaps"]),
        "refetches": statistics.median(extra["refetches"]),
        "cpu_per_step": {k: statistics.median(v) for k, v in extra["cpu_workers"].items()},
        "cpu_viewers": statistics.median(extra["cpu_viewers"]),
        "cpu_server": statistics.median(extra["cpu_server"]),
        "memory": memory,
    }


SERVER_PID: list[int] = []


# --- (3) a large run page --------------------------------------------------------------------------------------
def build_big_run(n_tasks: int, calls_per_task: int, n_ops: int, fixtures):
    """A completed run of ``n_tasks`` tasks (a 4-ary dependency tree) over five agents: run span, a task and
    an attempt span per task (every 20th task has a failed first attempt), ``calls_per_task`` model/tool call
    spans per attempt with tokens and cost, ``n_ops`` ledger rows on tool calls, an artifact per task."""
    from datetime import timedelta

    from django.db import transaction
    from django.utils import timezone

    from agents.models import Agent
    from runs.models import Artifact, Run, Span, Task
    from tools.models import ToolOperation

    workflow, _agent, project, user = fixtures
    agents = [Agent.objects.create(slug=f"bench-agent-{i}", name=f"agent {i}", script=[]) for i in range(5)]
    start = timezone.now() - timedelta(hours=1)
    rnd = random.Random(3)
    with transaction.atomic():
        run = Run.objects.create(
            workflow=workflow,
            project=project,
            goal="a large fan-out",
            status=Run.Status.COMPLETED,
            started_at=start,
            finished_at=start + timedelta(minutes=50),
            started_by=user,
            code_version="bench",
        )
        root = Span.objects.create(
            run=run, kind="run", name="run big", started_at=start, ended_at=start + timedelta(minutes=50)
        )
        tasks = []
        for i in range(n_tasks):
            t_start = start + timedelta(seconds=i * 2.5)
            tasks.append(
                Task(
                    run=run,
                    key=f"t{i}",
                    agent=agents[i % 5],
                    objective=f"work item {i}",
                    depends_on=[f"t{(i - 1) // 4}"] if i else [],
                    status=Task.Status.COMPLETED,
                    attempts=2 if i % 20 == 7 else 1,
                    started_at=t_start,
                    finished_at=t_start + timedelta(seconds=20 + rnd.random() * 20),
                    steps_used=calls_per_task,
                    tokens_used=0,
                    cost_micros=0,
                )
            )
        Task.objects.bulk_create(tasks, batch_size=2000)
        tspans = Span.objects.bulk_create(
            [
                Span(
                    run=run,
                    task=t,
                    parent=root,
                    kind="task",
                    name=t.key,
                    started_at=t.started_at,
                    ended_at=t.finished_at,
                )
                for t in tasks
            ],
            batch_size=2000,
        )
        attempts = []
        for t, ts in zip(tasks, tspans, strict=True):
            for a in range(1, t.attempts + 1):
                last = a == t.attempts
                attempts.append(
                    Span(
                        run=run,
                        task=t,
                        parent=ts,
                        kind="attempt",
                        name=f"attempt {a}",
                        attempt=a,
                        status="ok" if last else "error",
                        started_at=t.started_at,
                        ended_at=t.finished_at,
                    )
                )
        attempts = Span.objects.bulk_create(attempts, batch_size=2000)
        calls, run_tokens, run_cost = [], 0, 0
        by_task: dict[int, dict] = {}
        final_attempts = [a for a in attempts if a.status == "ok"]
        for a in final_attempts:
            for step in range(1, calls_per_task + 1):
                model = step % 2 == 1
                t_in, t_out = (rnd.randint(400, 2400), rnd.randint(50, 400)) if model else (0, 0)
                cost = (t_in * 3 + t_out * 15) if model else 0
                run_tokens += t_in + t_out
                run_cost += cost
                usage = by_task.setdefault(a.task_id, {"tokens": 0, "cost": 0})
                usage["tokens"] += t_in + t_out
                usage["cost"] += cost
                calls.append(
                    Span(
                        run=run,
                        task_id=a.task_id,
                        parent=a,
                        kind="model_call" if model else "tool_call",
                        name="scripted-1" if model else rnd.choice(["crm.read", "tickets.create", "email.send"]),
                        attempt=a.attempt,
                        step=step,
                        started_at=a.started_at + timedelta(seconds=step),
                        ended_at=a.started_at + timedelta(seconds=step + 0.5),
                        tokens_in=t_in,
                        tokens_out=t_out,
                        cost_micros=cost,
                        body={"text": "step result " * 8} if model else {"ok": True, "id": f"x-{step}"},
                    )
                )
        calls = Span.objects.bulk_create(calls, batch_size=2000)
        ops = []
        tool_calls = [c for c in calls if c.kind == "tool_call"]
        for n, c in enumerate(tool_calls[:: max(1, len(tool_calls) // max(n_ops, 1))][:n_ops]):
            write = c.name != "crm.read"
            ops.append(
                ToolOperation(
                    gate="allow",
                    run=run,
                    task_id=c.task_id,
                    step=c.step,
                    call_number=(c.step + 1) // 2,
                    tool=c.name,
                    idempotency_key=f"warden:{run.id}:{c.task_id}:{c.step}:e0",
                    arguments_hash=f"{n:064x}",
                    arguments={"customer_id": f"cust-{n}"},
                    tool_class="non_idempotent_write"
                    if c.name == "email.send"
                    else ("idempotent_write" if write else "read_only"),
                    reversibility=("irreversible" if c.name == "email.send" else "reversible") if write else "",
                    compensation={"tool": "tickets.close", "arguments": {}} if c.name == "tickets.create" else None,
                    status="committed",
                    result={"ok": True},
                    attempts=1,
                    started_at=c.started_at,
                    committed_at=c.ended_at,
                    ended_at=c.ended_at,
                )
            )
        ToolOperation.objects.bulk_create(ops, batch_size=2000)
        Artifact.objects.bulk_create(
            [
                Artifact(run=run, task=t, key=t.key, content={"summary": f"done {t.key}"}, provenance={"attempt": 1})
                for t in tasks
            ],
            batch_size=2000,
        )
        for t in tasks:
            t.tokens_used, t.cost_micros = by_task[t.id]["tokens"], by_task[t.id]["cost"]
        Task.objects.bulk_update(tasks, ["tokens_used", "cost_micros"], batch_size=2000)
        Run.objects.filter(id=run.id).update(
            steps_used=len(calls), tokens_used=run_tokens, cost_micros=run_cost, tool_calls_used=len(tool_calls)
        )
    spans = 1 + len(tspans) + len(attempts) + len(calls)
    return run, spans, len(ops)


def timed_get(client, path: str, repeat: int) -> tuple[float, int, int]:
    """Median ms of ``repeat`` GETs after one warm-up, the query count and the response size."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    response = client.get(path)
    if response.status_code != 200:
        return float("nan"), response.status_code, 0
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        client.get(path)
        times.append((time.perf_counter() - t) * 1000)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(path)
    return statistics.median(times), len(queries), len(response.content)


def push_render(run) -> float:
    """Median ms of run_push (what the publisher renders for one change) on ``run`` after a tool call."""
    from django.db import transaction
    from django.utils import timezone

    from dashboard.views.run_page import run_push
    from runs.models import Span
    from runs.services import sql

    attempt = Span.objects.filter(run=run, kind="attempt", status="ok").order_by("-id").first()
    run_push(run.id)  # the watermark
    times = []
    for _ in range(5):
        with transaction.atomic():
            sql.insert_span(
                run_id=run.id,
                task_id=attempt.task_id,
                parent_id=attempt.id,
                kind="tool_call",
                name="crm.read",
                started_at=timezone.now(),
                ended_at=timezone.now(),
            )
        t = time.perf_counter()
        run_push(run.id)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


# --- (4) the runs list ---------------------------------------------------------------------------------------
def build_runs(n: int, fixtures) -> tuple[int, int]:
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone

    from agents.models import Agent, Workflow
    from runs.models import Run, Task
    from tenancy.models import Project

    _workflow, agent, project, user = fixtures
    workflows = list(Workflow.objects.all())
    other = Project.objects.create(slug="bench-other", name="Other team")
    people = [user] + [
        get_user_model().objects.create_user(f"operator{i}", f"op{i}@example.invalid", "x-pass-12345") for i in range(4)
    ]
    statuses = (
        ["completed"] * 60
        + ["failed"] * 10
        + ["cancelled"] * 5
        + ["compensated"] * 2
        + ["running"] * 8
        + ["needs_attention"] * 5
        + ["waiting_for_approval"] * 3
        + ["pending"] * 7
    )
    rnd = random.Random(4)
    now = timezone.now()
    batch = 10_000
    first_id = None
    agents = list(Agent.objects.all()[:5]) or [agent]
    for b in range(0, n, batch):
        rows = []
        for i in range(b, min(n, b + batch)):
            status = rnd.choice(statuses)
            started = now - timedelta(minutes=(n - i) * 2)
            rows.append(
                Run(
                    workflow=rnd.choice(workflows),
                    project=project if i % 5 else other,
                    goal=f"{rnd.choice(['Review', 'Triage', 'Follow up', 'Audit'])} incident {i}",
                    status=status,
                    started_at=None if status == "pending" else started,
                    finished_at=started + timedelta(seconds=rnd.randint(5, 900))
                    if status in ("completed", "failed", "cancelled", "compensated")
                    else None,
                    started_by=people[i % len(people)],
                    steps_used=rnd.randint(0, 60),
                    tokens_used=rnd.randint(0, 40_000),
                    cost_micros=rnd.randint(0, 200_000),
                    max_steps=rnd.choice([None, 100, 500]),
                    code_version="bench",
                    status_reason="task failed: validation" if status == "failed" else "",
                )
            )
        created = Run.objects.bulk_create(rows, batch_size=batch)
        if first_id is None:
            first_id = created[0].id
        tasks = []
        for r in created[::10]:  # a few tasks for one run in ten
            for k in range(3):
                tasks.append(
                    Task(
                        run=r,
                        key=f"t{k}",
                        agent=agents[k % len(agents)],
                        objective="x",
                        status="completed" if r.status == "completed" or k < 2 else "pending",
                    )
                )
        Task.objects.bulk_create(tasks, batch_size=batch)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE runs_run")
        cursor.execute("ANALYZE runs_task")
    return first_id, Run.objects.count()


# --- main ------------------------------------------------------------------------------------------------------
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--viewers", type=int, default=50, help="websockets watching (1) and (2)")
    parser.add_argument("--events", type=int, default=200, help="changes committed in (1)")
    parser.add_argument("--rate", type=float, default=20.0, help="changes per second in (1)")
    parser.add_argument("--engine-runs", type=int, default=4, help="concurrent runs in (2)")
    parser.add_argument("--engine-steps", type=int, default=1000, help="journaled steps per run in (2)")
    parser.add_argument("--processes", type=int, default=2, help="worker processes in (2)")
    parser.add_argument("--threads", type=int, default=2, help="threads per worker process in (2)")
    parser.add_argument("--repeat", type=int, default=3, help="(2): each mode this many times, alternating")
    parser.add_argument("--page-tasks", type=int, default=10_000, help="tasks of the run page in (3)")
    parser.add_argument("--calls-per-task", type=int, default=8, help="model/tool call spans per task in (3)")
    parser.add_argument("--page-ops", type=int, default=1000, help="ledger rows of the run page in (3)")
    parser.add_argument("--runs-list", type=int, default=1_000_000, help="runs in the list in (4)")
    parser.add_argument("--samples", type=int, default=5, help="timed page renders (median) in (3) and (4)")
    parser.add_argument("--quick", action="store_true", help="a small version of everything (a smoke check)")
    parser.add_argument("--database-url", default=os.environ.get("WARDEN_BENCH_DASH_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--redis-url", default=os.environ.get("WARDEN_BENCH_REDIS_URL", DEFAULT_REDIS))
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures (bench/run.py)")
    parser.add_argument("--viewer-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--targets", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.viewer_child:
        return viewer_child(args)
    if args.quick:
        args.viewers, args.events, args.engine_steps, args.repeat = 10, 40, 300, 1
        args.page_tasks, args.page_ops, args.runs_list, args.samples = 200, 200, 5_000, 3

    db_name = urlparse(args.database_url).path.lstrip("/")
    if "bench" not in db_name:
        raise SystemExit(f"refusing to drop and recreate {db_name!r}: give a database whose name says bench")
    namespace = f"warden-bench-dash-{os.getpid()}"
    os.environ.update(
        DATABASE_URL=args.database_url,
        REDIS_URL=args.redis_url,
        WARDEN_QUEUE_NAMESPACE=namespace,
        DJANGO_SETTINGS_MODULE="config.settings.base",
        DJANGO_SECRET_KEY=os.urandom(24).hex(),
        DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
    )
    sys.path.insert(0, str(ROOT))
    # Ids far from those of test databases sharing this Redis: channel groups are named run-<id>, user-<id>.
    id_base = (100 + os.getpid() % 1900) * 1_000_000  # auth_user.id is a 32-bit integer
    log_dir = Path(f"/tmp/warden-bench-dash-{os.getpid()}")
    log_dir.mkdir(exist_ok=True)

    # A SIGTERM unwinds like Ctrl-C, so the server, the workers and the viewers are stopped and the database dropped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    db_create(args.database_url)
    server = None
    load_start = Path("/proc/loadavg").read_text().split()[:3]
    rows, notes, figures = [], [], {}
    try:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0)
        with connection.cursor() as cursor:
            for table in ("runs_run", "auth_user", "runs_task"):
                cursor.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), %s)", [id_base])
        from agents.demo import load_demo_workflows
        from agents.models import Workflow
        from tenancy.access import default_project

        load_demo_workflows()
        agent = bench_agents_and_workflows(args.engine_steps)
        user, client, sessionid = superuser_session()
        fixtures = (Workflow.objects.get(slug="bench-dash-long"), agent, default_project(), user)

        port = free_port()
        server = server_start(port, log_dir / "server.log")
        SERVER_PID.append(server.pid)

        # (1)
        print(
            f"(1) {args.events} changes at {args.rate:g}/s to {args.viewers} viewers, and as many bare sends …",
            flush=True,
        )
        p = push_latency(args, port, sessionid, fixtures, server)
        pairs = p["events"] * p["sockets"]
        dash, bare = p["dash"], p["bare"]
        figures.update(
            viewers=p["sockets"],
            push_p50_ms=dash[0],
            push_p99_ms=dash[1],
            bare_group_send_p50_ms=bare[0],
            bare_group_send_p99_ms=bare[1],
            pushes_lost=p["dash_lost"],
            pushes_expected=pairs,
        )
        rows.append(
            (
                f"(1) push latency p50 / p99, {p['sockets']} viewers",
                f"{dash[0]:.1f} / {dash[1]:.1f} ms",
                f"bare group_send {bare[0]:.1f} / {bare[1]:.1f} ms",
                f"{dash[0] / bare[0]:.1f}× / {dash[1] / bare[1]:.1f}×",
                "P5: ≤ 1.3× / ≤ 1.2×",
            )
        )
        rows.append(
            (
                "(1) pushes lost (event × socket)",
                f"{p['dash_lost']} of {pairs:,}",
                f"bare: {p['bare_lost']} of {pairs:,}",
                "—",
                "0",
            )
        )
        notes.append(
            f"(1) publisher in the bench process: render p50/p99 {p['render'][0]:.1f} / {p['render'][1]:.1f} ms, "
            f"group_send {p['send'][0]:.1f} / {p['send'][1]:.1f} ms, push {p['push_bytes'] / 1024:.1f} kB; "
            f"{p['pushes_per_socket']:.0f} pushes per socket for {p['events']} changes, {p['gaps']} sequence gaps, "
            f"{p['refetches']} refetches, {p['closed']} sockets closed"
        )
        notes.append(
            f"(1) CPU s: ASGI server {p['cpu_server_bare']:.2f} (bare) / {p['cpu_server_dash']:.2f} (dashboard), "
            f"viewer process {p['cpu_viewers_bare']:.2f} / {p['cpu_viewers_dash']:.2f}, "
            f"bench process (commits + publisher) {p['cpu_bench_dash']:.2f} in the dashboard phase"
        )

        # (2)
        runs_n, steps_n = args.engine_runs, args.engine_steps
        threads = f"{args.processes}×{args.threads} worker threads"
        print(
            f"(2) {runs_n} runs × {steps_n} steps, {threads}, unwatched and watched, {args.repeat}× each …", flush=True
        )
        e = engine_with_viewers(args, port, sessionid, log_dir)
        figures.update(steps_per_s_watched=e["viewers"], steps_per_s_unwatched=e["none"])
        rows.append(
            (
                f"(2) {runs_n} runs × {steps_n} steps, {args.viewers} viewers over them",
                f"{e['viewers']:,.0f} steps/s",
                f"no viewers {e['none']:,.0f} steps/s",
                f"{e['viewers'] / e['none']:.2f}×",
                "P6: ≥ 0.9×",
            )
        )
        notes.append(
            f"(2) {threads}; viewers spread evenly over the {runs_n} runs; all runs (steps/s): "
            + ", ".join(f"{k} " + " ".join(f"{v:,.0f}" for v in vs) for k, vs in e["all"].items())
        )
        notes.append(
            f"(2) worker CPU per step {e['cpu_per_step']['none']:.3f} ms unwatched / "
            f"{e['cpu_per_step']['viewers']:.3f} ms watched; {e['pushes']:.0f} pushes per socket per workload, "
            f"{e['gaps']:.0f} sequence gaps (a browser refetches the page on each), "
            f"ASGI server CPU {e['cpu_server']:.2f} s, viewer process {e['cpu_viewers']:.2f} s per workload"
        )

        # (3)
        print(f"(3) building a run of {args.page_tasks} tasks …", flush=True)
        t = time.perf_counter()
        big, spans, ops = build_big_run(args.page_tasks, args.calls_per_task, args.page_ops, fixtures)
        print(f"    built in {time.perf_counter() - t:.1f} s; rendering /runs/{big.id}/ …", flush=True)
        ms, queries, size = timed_get(client, f"/runs/{big.id}/", args.samples)
        figures.update(run_page_tasks=args.page_tasks, run_page_ms=ms, run_page_queries=queries)
        rows.append(
            (
                f"(3) run page, {args.page_tasks:,} tasks / {spans:,} spans / {ops:,} ops",
                f"{ms:.0f} ms, {queries} queries, {size / 1024:.0f} kB",
                "—",
                "—",
                "P7: ≤ 600 ms at 10,000 tasks",
            )
        )

        ms = push_render(big)
        rows.append(("(3) a live push's render on that run (publisher)", f"{ms:.0f} ms", "—", "—", "—"))

        # (4)
        print(f"(4) building {args.runs_list:,} runs …", flush=True)
        t = time.perf_counter()
        first_id, total = build_runs(args.runs_list, fixtures)
        print(f"    built in {time.perf_counter() - t:.1f} s; rendering the list …", flush=True)
        for label, path in (
            ("first page", "/runs/"),
            ("status=failed", "/runs/?status=failed"),
            ("deep keyset page", f"/runs/?after={first_id + 75}"),
            ("workflow filter", "/runs/?workflow=incident-fanout"),
            ("search, a common word", "/runs/?q=Triage"),
            ("search, one run's goal", f"/runs/?q=incident+{total // 2}"),
        ):
            ms, queries, size = timed_get(client, path, args.samples)
            figures[f"runs_list_ms ({label})"] = ms
            if ms != ms:  # NaN: the view answered something else than 200
                value = f"n/a (list not ready: HTTP {queries})"
            else:
                value = f"{ms:.0f} ms, {queries} queries"
            rows.append((f"(4) runs list ({total:,} runs), {label}", value, "—", "—", "P8: ≤ 50 ms at 1,000,000"))

        server_rss = rss_mb(server.pid)
        workers_rss = " + ".join(f"{mb:.0f}" for _, mb in e["memory"]["workers"])
        figures.update(
            runs_listed=total, server_rss_mb=server_rss, worker_rss_mb=[mb for _, mb in e["memory"]["workers"]]
        )
        rows.append(("ASGI server RSS (end)", f"{server_rss:.0f} MB", "—", "—", "—"))
        rows.append(("worker processes RSS (end of (2))", f"{workers_rss} MB", "—", "—", "—"))
    finally:
        if server is not None:
            kill_group(server)
        from django.db import connections

        best_effort("close the database connections", connections.close_all, attempts=1)
        best_effort(f"forget the Redis keys of {namespace}", redis_cleanup, args.redis_url, namespace, id_base)
        if not args.keep:
            best_effort(f"drop the database {db_name}", db_drop, args.database_url)
    shutil.rmtree(log_dir, ignore_errors=True)  # kept when something failed: the processes' logs are there

    header = ("figure", "value", "reference", "ratio", "goal")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(5)]
    print()
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    load_end = Path("/proc/loadavg").read_text().split()[:3]
    notes.append(
        f"load average (1, 5, 15 min): {' '.join(load_start)} at the start, {' '.join(load_end)} at the end; "
        f"{os.cpu_count()} cores"
    )
    print()
    for note in notes:
        print(note)
    if args.json:
        print(json.dumps({"bench": "dashboard", "rows": rows, "notes": notes, "figures": figures}, ensure_ascii=False))


def redis_cleanup(url: str, namespace: str, id_base: int) -> None:
    """Our queues and cache keys, and the channel groups of our runs and users (their ids start at id_base)."""
    import redis

    client = redis.Redis.from_url(url)
    stem = str(id_base // 1_000_000)
    digits = "?" * 6
    patterns = [f"{namespace}:*"] + [f"{CHANNELS_PREFIX}:group:{kind}-{stem}{digits}" for kind in ("run", "user")]
    for pattern in patterns:
        for key in client.scan_iter(pattern):
            client.delete(key)


if __name__ == "__main__":
    main()
