"""What GET /metrics costs, on PostgreSQL + Redis with real `rundramatiq` workers.

  (1) one scrape with 1,000 runs in flight (started, no worker yet: 1,000 running runs, 1,000 queue
      messages, the outbox and the metric files of earlier worker processes): p50 / p99 of the scrape as the
      view builds it (dashboard.ops.metrics_text: every process's files summed, then the state queries), and
      its size;
  (2) the engine's steps/s on those 1,000 runs × 10 steps (2 worker processes × 2 threads), without and with
      a scrape every second from this process, alternated; the ratio of the medians.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/warden_bench_metrics REDIS_URL=redis://127.0.0.1:6379/0 \
        .venv/bin/python bench/metrics_scrape.py [--runs 1000] [--steps 10] [--repeat 2] [--json]

The database is dropped and recreated, and dropped again at the end; the queue namespace and the metric
files are this run's own and removed at the end.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/warden_bench_metrics")
os.environ.setdefault("WARDEN_QUEUE_NAMESPACE", f"warden-bench-metrics-{os.getpid()}")
# The metric files of this run only, shared with the workers it starts (they inherit the environment).
os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="warden-bench-metrics-")

from engine import Workers, ensure_database, redis_forget  # noqa: E402  (bench/engine.py)


def start_runs(count: int) -> list[int]:
    from runs.services import run_start

    return [run_start(workflow="bench-metrics").id for _ in range(count)]


def scrape_times(count: int) -> tuple[list[float], int]:
    from dashboard.ops import metrics_text

    times, size = [], 0
    for _ in range(count):
        started = time.perf_counter()
        size = len(metrics_text())
        times.append((time.perf_counter() - started) * 1000)
    return sorted(times), size


class Scraper(threading.Thread):
    """A scrape every second, as Prometheus would, until stopped."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stopped, self.count = threading.Event(), 0

    def run(self):
        from django.db import connection

        from dashboard.ops import metrics_text

        while not self.stopped.wait(1.0):
            metrics_text()
            self.count += 1
        connection.close()


def steps_per_second(run_ids: list[int]) -> float:
    """Journaled steps over the time from the first step's start to the last one's end (worker start-up
    and the runs' creation are outside it)."""
    from django.db.models import Count, Max, Min

    from runs.models import Span

    found = Span.objects.filter(run_id__in=run_ids, step__isnull=False).aggregate(
        n=Count("id"), first=Min("started_at"), last=Max("ended_at")
    )
    return found["n"] / (found["last"] - found["first"]).total_seconds()


def one_round(args, *, scraping: bool) -> tuple[float, int]:
    from engine import wait_done

    run_ids = start_runs(args.runs)
    scraper = Scraper() if scraping else None
    if scraper:
        scraper.start()
    workers = Workers(processes=2, threads=2)
    try:
        wait_done(run_ids, timeout=900)
    finally:
        workers.stop()
        if scraper:
            scraper.stopped.set()
            scraper.join()
    return steps_per_second(run_ids), scraper.count if scraper else 0


def measure(args) -> dict:
    from django.core.management import call_command

    from agents.models import Agent, Workflow

    call_command("migrate", verbosity=0)
    script = [{"say": "step {turn}", "repeat": args.steps - 1}, {"final": {"done": True}}]
    agent = Agent.objects.create(slug="bench-metrics", name="metrics", script=script)
    Workflow.objects.create(
        slug="bench-metrics", name="metrics", tasks=[{"key": "t", "agent": agent.slug, "objective": "go"}]
    )

    print("warming up: one round of 20 runs (the workers' metric files exist from then on) …", flush=True)
    one_round(argparse.Namespace(**{**vars(args), "runs": 20}), scraping=False)
    print(f"(1) {args.runs} runs in flight, 30 scrapes …", flush=True)
    in_flight = start_runs(args.runs)
    times, size = scrape_times(30)
    from engine import wait_done

    workers = Workers(processes=2, threads=2)  # finish them, so the rounds below start from an idle engine
    try:
        wait_done(in_flight, timeout=900)
    finally:
        workers.stop()

    rates = {False: [], True: []}
    for rep in range(args.repeat):
        for scraping in (False, True) if rep % 2 == 0 else (True, False):
            label = "with a scrape every second" if scraping else "without scrapes"
            print(f"(2) round {rep + 1}: {args.runs} runs × {args.steps} steps, {label} …", flush=True)
            rate, scrapes = one_round(args, scraping=scraping)
            rates[scraping].append(rate)
            print(f"    {rate:,.0f} steps/s" + (f" ({scrapes} scrapes)" if scraping else ""), flush=True)
    without, with_ = statistics.median(rates[False]), statistics.median(rates[True])
    return {
        "scrape_p50_ms": statistics.median(times),
        "scrape_p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))],
        "scrape_bytes": size,
        "steps_per_s_without_scrapes": without,
        "steps_per_s_with_scrapes": with_,
        "ratio": with_ / without,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=2, help="rounds of each kind, alternated (medians printed)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = parser.parse_args()
    url = os.environ["DATABASE_URL"]
    ensure_database(url)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    try:
        figures = measure(args)
    finally:
        from django.db import connections

        connections.close_all()
        ensure_database(url, create=False)
        redis_forget(os.environ["REDIS_URL"], os.environ["WARDEN_QUEUE_NAMESPACE"])
        shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)
    print(f"scrape with {args.runs} runs in flight: p50 {figures['scrape_p50_ms']:.1f} ms, "
          f"p99 {figures['scrape_p99_ms']:.1f} ms, {figures['scrape_bytes']:,} bytes")  # fmt: skip
    print(f"steps/s without scrapes {figures['steps_per_s_without_scrapes']:,.0f}, with a scrape every second "
          f"{figures['steps_per_s_with_scrapes']:,.0f}: {figures['ratio']:.3f}× (goal ≥ 0.95×)")  # fmt: skip
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
