"""The engine's workloads in embedded mode: SQLite (WAL) and the in-process worker threads of
`manage.py serve`, in this one process, as a team trying Warden on a laptop runs it.

  (1) one task of 1,000 journaled steps;
  (2) 100 runs × 10 steps, started one after the other, on 4 worker threads;
  (3) a chain of 100 dependent one-step tasks: the task-to-task hop, p50/p99.

    .venv/bin/python bench/embedded.py [--quick] [--json]

Figures: steps/s (median of --repeat) and this process's CPU per step (the starts included: the process
starts the runs too). The database is a file in a temporary folder, removed at the end. Nothing is
contacted: no PostgreSQL, no Redis.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))


def measure(args) -> dict:
    import dramatiq
    import engine  # bench/engine.py: the same workflows
    from django.core.management import call_command

    from runs.models import Run, Span, Task
    from runs.services import run_start

    call_command("migrate", verbosity=0)
    engine.setup_workflows(args.steps, args.run_steps, args.chain)
    worker = dramatiq.Worker(dramatiq.get_broker(), worker_threads=args.threads, worker_timeout=100)
    worker.start()

    def timed(start):
        cpu0 = time.process_time()
        ids = start()
        engine.wait_done(ids)
        cpu = time.process_time() - cpu0
        runs = Run.objects.filter(id__in=ids)
        elapsed = (max(r.finished_at for r in runs) - min(r.started_at for r in runs)).total_seconds()
        steps = Span.objects.filter(run_id__in=ids, step__isnull=False).count()
        return ids, steps / elapsed, cpu / steps * 1000

    try:
        timed(lambda: [run_start(workflow="bench-short").id for _ in range(5)])  # warm up
        print(f"(1) one task of {args.steps} journaled steps, {args.repeat}× …", flush=True)
        one = [timed(lambda: [run_start(workflow="bench-long").id]) for _ in range(args.repeat)]
        print(f"(2) {args.runs} runs × {args.run_steps} steps, {args.repeat}× …", flush=True)
        many = [
            timed(lambda: [run_start(workflow="bench-short").id for _ in range(args.runs)]) for _ in range(args.repeat)
        ]
        print(f"(3) a chain of {args.chain} dependent one-step tasks, {args.repeat}× …", flush=True)
        hops = []
        for _ in range(args.repeat):
            ((chain,), _, _) = timed(lambda: [run_start(workflow="bench-chain").id])
            finished = dict(Task.objects.filter(run_id=chain).values_list("key", "finished_at"))
            started = dict(
                Span.objects.filter(run_id=chain, kind="model_call", step=1).values_list("task__key", "started_at")
            )
            hops += [(started[f"t{i}"] - finished[f"t{i - 1}"]).total_seconds() * 1000 for i in range(1, args.chain)]
    finally:
        worker.stop()
    hops.sort()
    return {
        "steps_per_s_1": statistics.median(r[1] for r in one),
        "cpu_ms_per_step_1": statistics.median(r[2] for r in one),
        "steps_per_s_2": statistics.median(r[1] for r in many),
        "cpu_ms_per_step_2": statistics.median(r[2] for r in many),
        "hop_p50_ms": statistics.median(hops),
        "hop_p99_ms": hops[min(len(hops) - 1, int(len(hops) * 0.99))],
        "repeats_1": [round(r[1], 1) for r in one],
        "repeats_2": [round(r[1], 1) for r in many],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--run-steps", type=int, default=10)
    parser.add_argument("--chain", type=int, default=100)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.runs, args.chain, args.repeat = 300, 20, 20, 1
    with tempfile.TemporaryDirectory(prefix="warden-bench-embedded-") as folder:
        for name in ("DATABASE_URL", "REDIS_URL", "WARDEN_QUEUE_NAMESPACE"):
            os.environ.pop(name, None)  # embedded mode: no PostgreSQL, no Redis
        os.environ.update(WARDEN_SQLITE_PATH=f"{folder}/warden.sqlite3", DJANGO_SETTINGS_MODULE="config.settings.base")
        import django

        django.setup()
        figures = measure(args)
        from django.db import connections

        connections.close_all()
    print(
        f"(1) {figures['steps_per_s_1']:,.0f} steps/s, {figures['cpu_ms_per_step_1']:.3f} ms CPU per step; "
        f"(2) {figures['steps_per_s_2']:,.0f} steps/s, {figures['cpu_ms_per_step_2']:.3f} ms; "
        f"(3) hop p50 / p99 {figures['hop_p50_ms']:.2f} / {figures['hop_p99_ms']:.2f} ms",
        flush=True,
    )
    if args.json:
        print(json.dumps({"bench": "embedded", "rows": [], "notes": [], "figures": figures}))


if __name__ == "__main__":
    main()
