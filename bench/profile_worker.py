"""Where a worker's time goes in the engine benchmark's workload (1) or (2): py-spy samples of the worker
processes (Python stacks, waits included), and per step the database's commits and rows written
(pg_stat_database, pg_stat_user_tables) and the Redis commands (INFO commandstats) the workers caused.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/warden_bench_profile REDIS_URL=redis://127.0.0.1:6379/13 \
        .venv/bin/python bench/profile_worker.py [--workload many|long] [--runs 300] [--out /tmp/profile]

Needs py-spy (`pip install -e ".[bench]"`) and permission to attach to the workers (root, or
ptrace_scope 0). Writes <out>/<pid>.txt (collapsed stacks, for flamegraph.pl or speedscope) and prints
the top frames by own time and by total time, and the counts per step.
"""

import argparse
import collections
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/warden_bench_profile")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/13")

import engine  # noqa: E402  (bench/engine.py: the workloads, the workers, the database)


def counters(url: str, redis_url: str) -> dict:
    """The database's commits, statements' row writes, and Redis's commands, now."""
    import psycopg
    import redis

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url, autocommit=True) as conn:
        commits, rollbacks = conn.execute(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = %s", [name]
        ).fetchone()
        ins, upd, dele = conn.execute(
            "SELECT sum(n_tup_ins), sum(n_tup_upd), sum(n_tup_del) FROM pg_stat_user_tables"
        ).fetchone()
    stats = redis.Redis.from_url(redis_url).info("commandstats")
    found = {"commits": commits, "rollbacks": rollbacks, "inserts": ins, "updates": upd, "deletes": dele}
    for command, figures in stats.items():
        found[f"redis {command.removeprefix('cmdstat_')}"] = figures["calls"]
    return found


def top(path: Path, n: int) -> tuple[list, list, int]:
    """Own-time and total-time leaders of a collapsed-stacks file."""
    own, total, samples = collections.Counter(), collections.Counter(), 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        count = int(count)
        samples += count
        frames = stack.split(";")
        own[frames[-1]] += count
        for frame in set(frames):
            total[frame] += count
    return own.most_common(n), total.most_common(n), samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["long", "many"], default="many")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--steps", type=int, default=3000, help="steps of the one run of workload long")
    parser.add_argument("--out", default="/tmp/warden-profile")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    url = os.environ["DATABASE_URL"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    engine.ensure_database(url)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    engine.setup_workflows(args.steps, 10, 2)
    from runs.services import run_start

    workers = engine.Workers(processes=2, threads=2) if args.workload == "many" else engine.Workers(1, 1)
    try:
        engine.timed(workers, lambda: [run_start(workflow="bench-short").id for _ in range(20)])  # warm up
        spies = [
            subprocess.Popen(
                [
                    "py-spy",
                    "record",
                    "--pid",
                    str(pid),
                    "--rate",
                    "250",
                    "--format",
                    "raw",
                    "--output",
                    str(out / f"{pid}.txt"),
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            for pid in workers.children()
        ]
        time.sleep(1.0)
        before = counters(url, os.environ["REDIS_URL"])
        if args.workload == "many":
            runs = lambda: [run_start(workflow="bench-short").id for _ in range(args.runs)]  # noqa: E731
        else:
            runs = lambda: [run_start(workflow="bench-long").id]  # noqa: E731
        run_ids, seconds, steps, cpu = engine.timed(workers, runs)
        after = counters(url, os.environ["REDIS_URL"])
        for spy in spies:
            spy.send_signal(2)
            spy.wait(timeout=30)
    finally:
        workers.stop()
        engine.ensure_database(url, create=False)
    print(f"{steps} steps in {seconds:.2f} s: {steps / seconds:,.0f} steps/s, {cpu / steps * 1000:.3f} ms CPU/step")
    print("per step:", ", ".join(f"{k} {(after[k] - before.get(k, 0)) / steps:.2f}" for k in sorted(after)
                                 if after[k] != before.get(k, 0)))  # fmt: skip
    for path in sorted(out.glob("*.txt")):
        own, total, samples = top(path, args.top)
        print(f"\n== {path} ({samples} samples, idle included)\n-- own time")
        for frame, count in own:
            print(f"{count / samples:6.1%}  {frame}")
        print("-- total time")
        for frame, count in total:
            print(f"{count / samples:6.1%}  {frame}")


if __name__ == "__main__":
    main()
