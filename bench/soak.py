"""A soak: incident-fanout runs back to back through the API on PostgreSQL, with an ASGI server and two
worker processes, as a deployment would serve them for hours.

For each thousand runs (--chunk) it prints runs/s and steps/s, the resident memory of the server and of
the workers, and the database's size; at the end, the growth from the first thousand to the last (memory
≤ 10%, steps/s within 10%: the goals), the database's bytes per run and per step, and the invariants of
the fault drills: duplicate effects, orphan effects, lost decisions (all 0).

    .venv/bin/python bench/soak.py [--runs 10000] [--chunk 1000] [--in-flight 8] [--quick] [--json]

Everything goes to 127.0.0.1: its own database (warden_bench_soak, dropped at the end unless --keep)
and Redis database 12. Runs are started through POST /api/v1/runs with an API token, --in-flight at a
time, each with an Idempotency-Key; a reviewer thread approves whatever waits for a decision (the plain
incident-fanout asks for none). It stops by itself: after --runs runs, or --timeout seconds (SIGTERM
stops it early, cleaning up).

The database is vacuumed after each chunk (--no-vacuum: not), as autovacuum does in production: the
PostgreSQL this is measured on runs with autovacuum off, and without vacuuming, dead row versions of the
ledger and task tables slowed every chunk by about a tenth (docs/benchmarks.md).
"""

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "chaos"))

import drills  # noqa: E402  (chaos/drills.py: the cluster, the API client, the reviewer, the invariants)

DATABASE = "warden_bench_soak"


class Cluster(drills.Cluster):
    """The drills' cluster with production timings (no short leases) and one process per worker."""

    def env(self) -> dict:
        env = super().env()
        for name in drills.TIMINGS:
            env.pop(name, None)
        env["WARDEN_QUEUE_NAMESPACE"] = f"warden-bench-soak-{self.port}"
        return env


def rss_mb(pid: int) -> float:
    """Resident memory of a process and its descendants (a rundramatiq parent forks its workers)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except FileNotFoundError:
            continue
        out = subprocess.run(["pgrep", "-P", str(p)], capture_output=True, text=True).stdout
        todo += [int(c) for c in out.split()]
    return total


def db_bytes() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(current_database())")
        return cursor.fetchone()[0]


def vacuum() -> float:
    """VACUUM (ANALYZE) the soak's database, as autovacuum would; seconds taken. The ledger, task and
    span rows are updated at every step, and their dead versions left in place slow every index scan
    (the saga's sweep took 0.6 s a pass after 5,000 runs on a PostgreSQL with autovacuum off)."""
    from django.db import connection

    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE)")
    return time.monotonic() - started


def finished_of(run_ids: list[int]) -> dict[int, int]:
    """{run id: steps used} of those of ``run_ids`` that settled."""
    from runs.models import Run

    rows = Run.objects.filter(id__in=run_ids, status__in=drills.SETTLED).values_list("id", "steps_used")
    return dict(rows)


def soak(args, cluster: Cluster, api: drills.Api) -> tuple[list[dict], list[int]]:
    """Keep --in-flight runs going until --runs have settled; a row of figures per --chunk."""
    chunks, started, in_flight, all_ids = [], 0, [], []
    chunk_start, chunk_runs, chunk_steps = time.monotonic(), 0, 0
    give_up = time.monotonic() + args.timeout
    while (started < args.runs or in_flight) and time.monotonic() < give_up:
        while started < args.runs and len(in_flight) < args.in_flight:
            run_id = api.run_start({"workflow": "incident-fanout", "input": {}}, f"soak-{started}", give_up)
            in_flight.append(run_id)
            all_ids.append(run_id)
            started += 1
        done = drills.read(finished_of, in_flight)
        if not done:
            time.sleep(0.02)
            continue
        in_flight = [r for r in in_flight if r not in done]
        chunk_runs += len(done)
        chunk_steps += sum(done.values())
        if chunk_runs >= args.chunk or (not in_flight and started >= args.runs):
            seconds = time.monotonic() - chunk_start
            row = {
                "runs": chunk_runs,
                "seconds": seconds,
                "runs_per_s": chunk_runs / seconds,
                "steps_per_s": chunk_steps / seconds,
                "server_rss_mb": rss_mb(cluster.server.pid),
                "workers_rss_mb": sum(rss_mb(w.pid) for w in cluster.workers),
                "db_mb": drills.read(db_bytes) / 2**20,
            }
            chunks.append(row)
            vacuumed = f", vacuumed in {drills.read(vacuum):.1f} s" if args.vacuum else ""
            print(
                f"{len(all_ids) - len(in_flight):>6,} runs settled: {row['runs_per_s']:.1f} runs/s, "
                f"{row['steps_per_s']:,.0f} steps/s, server {row['server_rss_mb']:.0f} MB, workers "
                f"{row['workers_rss_mb']:.0f} MB, database {row['db_mb']:,.0f} MB{vacuumed}",
                flush=True,
            )
            chunk_start, chunk_runs, chunk_steps = time.monotonic(), 0, 0
    return chunks, all_ids


def invariants() -> dict:
    """The drills' invariants over the whole database (it holds the soak's runs only): the drills' own
    query tests each run's key prefix, which over thousands of runs takes longer than the soak."""
    from django.db.models import Count, Exists, OuterRef

    from policy.models import ApprovalRequest
    from runs.models import Run
    from tools.models import SandboxCall, ToolOperation

    effects = SandboxCall.objects.filter(is_effect=True)
    intent = ToolOperation.objects.filter(idempotency_key=OuterRef("idempotency_key"))
    return {
        "completed": Run.objects.filter(status=Run.Status.COMPLETED).count(),
        "needs_attention": Run.objects.filter(status=Run.Status.NEEDS_ATTENTION).count(),
        "duplicates": effects.values("system", "idempotency_key").annotate(n=Count("id")).filter(n__gt=1).count(),
        "orphans": effects.filter(~Exists(intent)).count(),
        # Decisions still waiting in a finished run, or approved operations it never made.
        "lost": ApprovalRequest.objects.filter(status="pending", run__status=Run.Status.COMPLETED).count()
        + ToolOperation.objects.filter(run__status=Run.Status.COMPLETED, status__in=["approved"]).count(),
        "effects": effects.count(),
    }


def summary(chunks: list[dict], run_ids: list[int], db_before: int) -> dict:
    from django.db.models import Sum

    from runs.models import Run

    first, last = chunks[0], chunks[-1]
    steps = Run.objects.filter(id__in=run_ids).aggregate(n=Sum("steps_used"))["n"] or 0
    grown = drills.read(db_bytes) - db_before
    checks = drills.read(invariants)
    return {
        "runs": len(run_ids),
        "completed": checks["completed"],
        "steps": steps,
        "server_rss_growth": last["server_rss_mb"] / first["server_rss_mb"] - 1,
        "workers_rss_growth": last["workers_rss_mb"] / first["workers_rss_mb"] - 1,
        "steps_per_s_last_vs_first": last["steps_per_s"] / first["steps_per_s"],
        "steps_per_s_median": statistics.median(c["steps_per_s"] for c in chunks),
        "db_bytes_per_run": grown / max(1, len(run_ids)),
        "db_bytes_per_step": grown / max(1, steps),
        "duplicates": checks["duplicates"],
        "orphans": checks["orphans"],
        "lost": checks["lost"],
        "effects": checks["effects"],
        "needs_attention": checks["needs_attention"],
        "chunks": chunks,
    }


def report(found: dict) -> list[tuple]:
    def ok(met: bool) -> str:
        return "met" if met else "NOT MET"

    return [
        ("runs settled / completed", f"{found['runs']:,} / {found['completed']:,}", "—"),
        ("server RSS, last chunk vs first", f"{found['server_rss_growth']:+.1%}",
         ok(found["server_rss_growth"] <= 0.1)),
        (
            "workers' RSS, last chunk vs first",
            f"{found['workers_rss_growth']:+.1%}",
            ok(found["workers_rss_growth"] <= 0.1),
        ),
        (
            "steps/s, last chunk ÷ first",
            f"{found['steps_per_s_last_vs_first']:.2f}×",
            ok(abs(found["steps_per_s_last_vs_first"] - 1) <= 0.1),
        ),
        ("steps/s, median chunk", f"{found['steps_per_s_median']:,.0f}", "—"),
        ("database bytes per run / per step",
         f"{found['db_bytes_per_run']:,.0f} / {found['db_bytes_per_step']:,.0f}", "—"),
        ("duplicate effects", str(found["duplicates"]), ok(found["duplicates"] == 0)),
        ("orphan effects / lost decisions", f"{found['orphans']} / {found['lost']}",
         ok(not found["orphans"] + found["lost"])),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--chunk", type=int, default=1_000)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=4 * 3600)
    parser.add_argument("--quick", action="store_true", help="300 runs in chunks of 100")
    parser.add_argument(
        "--no-vacuum",
        dest="vacuum",
        action="store_false",
        help="do not VACUUM (ANALYZE) after each chunk (for a PostgreSQL whose autovacuum is on)",
    )
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.chunk = 300, 100
    # A SIGTERM (or the SIGINT a background job ignores) unwinds: the cluster stops, the database goes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    drills.TEMPLATE = DATABASE  # the drills' set-up, on a database of the soak's own
    print("creating the database, the demo workflows and the API tokens …", flush=True)
    drills.django_setup(DATABASE)
    tokens = drills.template_create()
    log_dir = Path(tempfile.mkdtemp(prefix="warden-bench-soak-"))
    cluster = Cluster(database=DATABASE, redis_url="redis://127.0.0.1:6379/12", log_dir=log_dir)
    reviewer = None
    try:
        cluster.start(workers=2)
        api = drills.Api(cluster.port, tokens["operator"])
        reviewer = drills.Reviewer(drills.Api(cluster.port, tokens["reviewer"]))
        reviewer.start()
        db_before = drills.read(db_bytes)
        print(f"{args.runs:,} incident-fanout runs, {args.in_flight} in flight, 2 worker processes …", flush=True)
        chunks, run_ids = soak(args, cluster, api)
        found = summary(chunks, run_ids, db_before)
    finally:
        if reviewer is not None:
            reviewer.stop.set()
        cluster.stop()
        from django.db import connections

        connections.close_all()
        if not args.keep:
            drills.db_drop(DATABASE)
    rows = report(found)
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    print()
    for row in rows:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    if args.json:
        print(json.dumps({"bench": "soak", "rows": [(*r[:2], "—", "—", r[2]) for r in rows], "figures": found}))


if __name__ == "__main__":
    main()
