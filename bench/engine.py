"""Engine benchmark on PostgreSQL + Redis with real `rundramatiq` workers.

Prints each figure next to PostgreSQL's single-row-commit rate measured in the same run with the same
number of clients (pgbench), as a ratio:
  (1) one task of 1,000 journaled steps (1 worker thread vs the 1-client floor);
  (2) 100 runs × 10 steps, started by 4 callers at once (4 worker threads in 2 processes vs the 4-client
      floor);
  (3) a chain of 100 dependent one-step tasks: the task-to-task hop, p50/p99;
and the workers' CPU per step (user + system time of the worker processes).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/warden_bench REDIS_URL=redis://127.0.0.1:6379/0 \
        .venv/bin/python bench/engine.py [--steps 1000] [--runs 100] [--chain 100] [--quick] [--json]

The database is dropped and recreated, and dropped again at the end unless --keep.
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/warden_bench")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
os.environ.setdefault("WARDEN_QUEUE_NAMESPACE", f"warden-bench-{os.getpid()}")
os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings.base"

from live_push import best_effort  # noqa: E402  (bench/live_push.py)


def ensure_database(url: str, create: bool = True) -> None:
    """Drop the database and (unless ``create`` is False) create it empty."""
    import psycopg

    parts = urlparse(url)
    name = parts.path.lstrip("/")
    admin = psycopg.connect(
        host=parts.hostname,
        port=parts.port or 5432,
        user=parts.username or "postgres",
        dbname="postgres",
        autocommit=True,
    )
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    if create:
        admin.execute(f'CREATE DATABASE "{name}"')
    admin.close()


def pg_commit_floor(url: str, clients: int, seconds: int = 5) -> float:
    """Single-row INSERT commits per second with `clients` connections (pgbench)."""
    import psycopg

    parts = urlparse(url)
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("CREATE TABLE IF NOT EXISTS bench_commit (id bigserial PRIMARY KEY, v integer)")
    conn.close()
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write("INSERT INTO bench_commit (v) VALUES (1);\n")
    try:
        out = _pgbench(script.name, parts, clients, seconds)
    finally:
        os.unlink(script.name)
    return float(re.search(r"tps = ([\d.]+)", out).group(1))


def _pgbench(script: str, parts, clients: int, seconds: int) -> str:
    return subprocess.run(
        [
            "pgbench",
            "-n",
            "-f",
            script,
            "-c",
            str(clients),
            "-j",
            str(clients),
            "-T",
            str(seconds),
            "-h",
            parts.hostname,
            "-p",
            str(parts.port or 5432),
            "-U",
            parts.username or "postgres",
            parts.path.lstrip("/"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


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


class Workers:
    def __init__(self, processes: int, threads: int):
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "rundramatiq", "--processes", str(processes), "--threads", str(threads)],
            cwd=ROOT,
            env=dict(os.environ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 30
            while len(self.children()) < processes and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1.0)  # let the workers declare their queues and boot
            if self.proc.poll() is not None:
                raise SystemExit(f"the workers exited (code {self.proc.returncode}); run manage.py rundramatiq")
        except BaseException:  # interrupted while starting: the caller has no handle to stop them with
            self.stop()
            raise

    def children(self):
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def cpu(self) -> float:
        return cpu_seconds(self.children())

    def stop(self):
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def setup_workflows(steps: int, run_steps: int, chain: int):
    from agents.models import Agent, Workflow

    long = Agent.objects.create(
        slug="bench-long", name="long", script=[{"say": "step {turn}", "repeat": steps - 1}, {"final": {"done": True}}]
    )
    short = Agent.objects.create(
        slug="bench-short",
        name="short",
        script=[{"say": "step {turn}", "repeat": run_steps - 1}, {"final": {"done": True}}],
    )
    hop = Agent.objects.create(slug="bench-hop", name="hop", script=[{"final": {"done": True}}])
    Workflow.objects.create(slug="bench-long", name="long", tasks=[{"key": "t", "agent": long.slug, "objective": "go"}])
    Workflow.objects.create(
        slug="bench-short", name="short", tasks=[{"key": "t", "agent": short.slug, "objective": "go"}]
    )
    Workflow.objects.create(
        slug="bench-chain",
        name="chain",
        max_tasks=chain,
        tasks=[
            {"key": f"t{i}", "agent": hop.slug, "objective": "hop", "depends_on": [f"t{i - 1}"] if i else []}
            for i in range(chain)
        ],
    )


def wait_done(run_ids, timeout=600):
    from runs.models import Run

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


def timed(workers: Workers, start_runs):
    from runs.models import Run, Span

    cpu0 = workers.cpu()
    run_ids = start_runs()
    wait_done(run_ids)
    cpu = workers.cpu() - cpu0
    runs = Run.objects.filter(id__in=run_ids)
    first = min(r.started_at for r in runs)
    last = max(r.finished_at for r in runs)
    steps = Span.objects.filter(run_id__in=run_ids, step__isnull=False).count()
    return run_ids, (last - first).total_seconds(), steps, cpu


def start_concurrently(n: int, workflow: str, clients: int = 4) -> list[int]:
    """``n`` runs started by ``clients`` callers at once, as API clients do (the peers' (2) starts its
    runs four at a time too). Each caller thread has its own database connection."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    from runs.services import run_start

    def start(_):
        try:
            return run_start(workflow=workflow).id
        finally:
            connection.close()

    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(start, range(n)))


def _medians(results) -> tuple[float, float]:
    """Median steps/s and worker CPU ms per step of repeated `timed` results."""
    rate = statistics.median(steps / elapsed for _, elapsed, steps, _ in results)
    cpu = statistics.median(cpu / steps * 1000 for _, _, steps, cpu in results)
    return rate, cpu


def _throughput_row(label: str, rate: float, floor: float, clients: int, goal: str) -> tuple:
    return (
        label,
        f"{rate:,.0f} steps/s",
        f"{clients}-client floor {floor:,.0f} commits/s",
        f"{rate / floor:.2f}×",
        goal,
    )


def measure(args, url: str) -> tuple[list, list, dict]:
    """The three scenarios on a migrated, empty database: the table's rows, notes and raw figures."""
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    setup_workflows(args.steps, args.run_steps, args.chain)
    from runs.models import Span, Task
    from runs.services import run_start

    print(f"measuring the PostgreSQL single-row-commit floor ({url.rsplit('@', 1)[-1]}) …", flush=True)
    floor1 = pg_commit_floor(url, 1, args.floor_seconds)
    floor4 = pg_commit_floor(url, 4, args.floor_seconds)

    rows = []
    reps = args.repeat
    workers = Workers(processes=1, threads=1)
    try:
        print(f"(1) one task of {args.steps} journaled steps, {reps}× …", flush=True)
        long_runs = [timed(workers, lambda: [run_start(workflow="bench-long").id]) for _ in range(reps)]
        rate1, cpu1 = _medians(long_runs)
        rows.append(_throughput_row(f"(1) 1 task × {args.steps} steps, 1 worker thread", rate1, floor1, 1, "P1: below"))

        print(f"(3) a chain of {args.chain} dependent one-step tasks, {reps}× …", flush=True)
        hops, cpu3 = [], []
        for _ in range(reps):
            (chain_run,), _, _, cpu = timed(workers, lambda: [run_start(workflow="bench-chain").id])
            cpu3.append(cpu / args.chain * 1000)
            finished = dict(Task.objects.filter(run_id=chain_run).values_list("key", "finished_at"))
            # The hop: from a task's completion to its successor's first model call.
            started = dict(
                Span.objects.filter(run_id=chain_run, kind="model_call", step=1).values_list("task__key", "started_at")
            )
            hops += [(started[f"t{i}"] - finished[f"t{i - 1}"]).total_seconds() * 1000 for i in range(1, args.chain)]
        hops.sort()
        p50, p99 = statistics.median(hops), hops[min(len(hops) - 1, int(len(hops) * 0.99))]
    finally:
        workers.stop()

    workers = Workers(processes=args.processes, threads=4 // args.processes)
    try:
        print(f"(2) {args.runs} concurrent runs × {args.run_steps} steps, {reps}× …", flush=True)
        many = [timed(workers, lambda: start_concurrently(args.runs, "bench-short")) for _ in range(reps)]
        rate2, cpu2 = _medians(many)
        threads = f"{args.processes}×{4 // args.processes} worker threads"
        rows.append(
            _throughput_row(f"(2) {args.runs} runs × {args.run_steps} steps, {threads}", rate2, floor4, 4, "P2: below")
        )
    finally:
        workers.stop()

    rows.append(
        (f"(3) chain of {args.chain} tasks: hop p50 / p99", f"{p50:.2f} / {p99:.2f} ms", "—", "—", "P3: p50 ≤ 2 ms")
    )
    rows.append(("worker CPU per step (1)", f"{cpu1:.3f} ms", "—", "—", "P4: ≤ 0.25 ms"))
    rows.append(("worker CPU per step (2)", f"{cpu2:.3f} ms", "—", "—", "P4: ≤ 0.35 ms"))
    rows.append(("worker CPU per task hop (3)", f"{statistics.median(cpu3):.3f} ms", "—", "—", "—"))
    notes = [f"medians of {reps} repetitions; hops pooled over {len(hops)} hand-offs"]
    figures = {
        "steps_per_s_1": rate1,
        "floor_1_client_commits_per_s": floor1,
        "steps_per_s_2": rate2,
        "floor_4_clients_commits_per_s": floor4,
        "hop_p50_ms": p50,
        "hop_p99_ms": p99,
        "cpu_ms_per_step_1": cpu1,
        "cpu_ms_per_step_2": cpu2,
        "cpu_ms_per_hop_3": statistics.median(cpu3),
    }
    return rows, notes, figures


def redis_forget(url: str, namespace: str) -> None:
    """The queues and cache keys of this benchmark's namespace (never those of a namespace given to it)."""
    import redis

    if not namespace.startswith("warden-bench-"):
        return
    client = redis.Redis.from_url(url)
    for key in client.scan_iter(f"{namespace}:*"):
        client.delete(key)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--run-steps", type=int, default=10)
    parser.add_argument("--chain", type=int, default=100)
    parser.add_argument(
        "--processes",
        type=int,
        default=2,
        choices=[1, 2, 4],
        help="worker processes for (2); the 4 worker threads are spread over them",
    )
    parser.add_argument("--repeat", type=int, default=3, help="repetitions of each scenario (medians are printed)")
    parser.add_argument("--floor-seconds", type=int, default=5, help="duration of each pgbench measurement")
    parser.add_argument("--quick", action="store_true", help="a small version of everything (a smoke check)")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures (bench/run.py)")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.runs, args.chain, args.repeat, args.floor_seconds = 300, 20, 20, 1, 2

    url = os.environ["DATABASE_URL"]
    # A SIGTERM unwinds like Ctrl-C, so the workers are stopped and the database dropped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ensure_database(url)
    try:
        import django

        django.setup()
        rows, notes, figures = measure(args, url)
    finally:
        from django.db import connections

        namespace = os.environ["WARDEN_QUEUE_NAMESPACE"]
        best_effort("close the database connections", connections.close_all, attempts=1)
        best_effort(f"forget the Redis keys of {namespace}", redis_forget, os.environ["REDIS_URL"], namespace)
        if not args.keep:
            best_effort(f"drop the database {url.rsplit('/', 1)[-1]}", ensure_database, url, False)

    print()
    for note in notes:
        print(note)
    header = ("figure", "value", "reference", "ratio", "goal")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(5)]
    print()
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    if args.json:
        print(json.dumps({"bench": "engine", "rows": rows, "notes": notes, "figures": figures}, ensure_ascii=False))


if __name__ == "__main__":
    main()
