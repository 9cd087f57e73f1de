"""Broker benchmark on PostgreSQL: what the ledger costs per tool call, in this process (no queue).

For each kind of call it prints p50/p99 latency and calls per second, next to PostgreSQL's 1-client
single-row-commit latency measured in the same run. A write is three commits by design (the intent
before the call, the sandbox system's own transaction, the receipt after), a read one or two (the
system's, the ledger row); a replay (the step's receipt found by key) calls nothing.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/warden_bench .venv/bin/python bench/broker.py [--calls 500]
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/warden_bench")
os.environ.pop("REDIS_URL", None)  # the broker's cache is in-process here: this measures the database path
os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings.base"

from engine import ensure_database  # noqa: E402  (bench/engine.py)


def commit_latency_ms(n: int = 500) -> float:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_commit (id bigserial PRIMARY KEY, v integer)")
    times = []
    for _ in range(n):
        started = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO bench_commit (v) VALUES (1)")
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def measure(label: str, calls: int, make_call) -> tuple[str, float, float, float]:
    times = []
    for n in range(calls):
        started = time.perf_counter()
        outcome = make_call(n)
        times.append(time.perf_counter() - started)
        assert outcome.error is None, outcome.error
    times.sort()
    p50, p99 = times[len(times) // 2] * 1000, times[int(len(times) * 0.99) - 1] * 1000
    return label, p50, p99, calls / sum(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args()
    ensure_database(os.environ["DATABASE_URL"])

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from agents.demo import load_demo_workflows
    from approvals.policies import demo_waivers_load
    from runs.models import Task
    from runs.services import run_start
    from tools.broker import tool_call

    load_demo_workflows()
    demo_waivers_load()
    run = run_start(workflow="incident-fanout")
    task = Task.objects.get(run=run, key="plan")
    task.allowed_tools = ["crm.read", "tickets.create", "email.send"]
    step = iter(range(1, 10**9))

    def call(name, arguments, at=None):
        return tool_call(run=run, task=task, step=at or next(step), call_number=1, name=name, arguments=arguments)

    floor = commit_latency_ms()
    rows = [
        measure("read (crm.read)", args.calls, lambda n: call("crm.read", {"customer_id": f"c{n}"})),
        measure(
            "idempotent write (tickets.create)",
            args.calls,
            lambda n: call("tickets.create", {"customer_id": f"c{n}", "title": "bench"}),
        ),
        measure(
            "non-idempotent write (email.send)",
            args.calls,
            lambda n: call("email.send", {"to": f"c{n}@x.example", "subject": "bench", "body": "b"}),
        ),
    ]
    first_write = 1 + args.calls  # the steps of the tickets.create calls above
    rows.append(
        measure(
            "replay of a committed write (by key)",
            args.calls,
            lambda n: call("tickets.create", {"customer_id": f"c{n}", "title": "bench"}, at=first_write + n),
        )
    )
    print(f"PostgreSQL 1-client single-row commit: {floor:.2f} ms (median)\n")
    print(f"{'call':40} {'p50 ms':>8} {'p99 ms':>8} {'calls/s':>9} {'p50 / commit':>13}")
    for label, p50, p99, rate in rows:
        print(f"{label:40} {p50:8.2f} {p99:8.2f} {rate:9.0f} {p50 / floor:12.1f}×")


if __name__ == "__main__":
    main()
