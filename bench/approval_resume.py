"""Approval-to-resume latency on PostgreSQL + Redis with real `rundramatiq` workers.

N runs of one task each park on a tool call that their workflow says needs approval (`tool_policies`
{"tickets.create": {"approval": "always"}}). A reviewer (not the runs' starter: separation of duties)
approves them one at a time through the integration API, as a client would. The figure is the time from
the commit of the decision to the moment a worker starts the approved call (its ledger row goes to
`executing`: ToolOperation.started_at), p50/p99.

The reference, measured in the same run on the same idle workers and interleaved with the decisions: a
bare message round trip — from the commit of a new one-task run to the moment a worker picks its task up
(the attempt span's started_at, stamped by the actor before its first statement). A decision reaches
the parked task by the same road (outbox row, Redis, an idle worker's poll), so resuming cannot beat it;
what it adds is the lease, the replay of the task's journal and the approval's recheck before the call.

    .venv/bin/python bench/approval_resume.py [--decisions 200] [--quick] [--json]

It creates its own database (`warden_bench_appr` by default; dropped at the end unless --keep), uses
Redis db 13 by default, starts its own workers on its own queue namespace and stops them itself.
"""

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
# This file is named like the `approvals` app: the project root must come first on the path, so that
# `import approvals` (Django's app registry) finds the app, not this script.
sys.path.insert(0, str(ROOT))

from live_push import (  # noqa: E402  (bench/live_push.py)
    best_effort,
    children,
    cpu_seconds,
    db_create,
    db_drop,
    kill_group,
    pct,
    rss_mb,
    workers_start,
)

DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/warden_bench_appr"
DEFAULT_REDIS = "redis://127.0.0.1:6379/13"
TOOL = "tickets.create"


def p50_p99(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), pct(values, 0.99)


# --- fixtures ------------------------------------------------------------------------------------------------
def people():
    """The runs' starter (an operator), a reviewer of the default project and the reviewer's API token."""
    from django.contrib.auth import get_user_model

    from tenancy.access import default_project, membership_grant
    from tenancy.tokens import api_token_create

    User = get_user_model()
    project = default_project()
    operator = User.objects.create_user("bench-operator", "operator@example.invalid", "bench-pass-123")
    reviewer = User.objects.create_user("bench-reviewer", "reviewer@example.invalid", "bench-pass-123")
    membership_grant(user=operator, project=project, role="operator")
    membership_grant(user=reviewer, project=project, role="reviewer")
    _token, raw = api_token_create(user=reviewer, name="bench", scopes=["read", "approve"])
    return operator, raw


def workflows() -> None:
    from agents.models import Agent, Workflow

    gated = Agent.objects.create(
        slug="bench-appr",
        name="gated",
        allowed_tools=[TOOL],
        output_schema={"type": "object"},
        script=[
            {"say": "Opening a ticket.", "tool": TOOL, "arguments": {"customer_id": "cust-1", "title": "bench"}},
            {"final": {"done": True}},
        ],
    )
    Workflow.objects.create(
        slug="bench-appr",
        name="gated",
        tasks=[{"key": "t", "agent": gated.slug, "objective": "open a ticket"}],
        tool_policies={TOOL: {"approval": "always"}},
    )
    bare = Agent.objects.create(
        slug="bench-appr-ref", name="bare", output_schema={"type": "object"}, script=[{"final": {"done": True}}]
    )
    Workflow.objects.create(
        slug="bench-appr-ref", name="bare", tasks=[{"key": "t", "agent": bare.slug, "objective": "finish"}]
    )


class CommitStamps:
    """The wall-clock moment (time.time(), the clock the workers stamp the database with) at which the
    transaction that wrote a Decision or a Run committed: an on_commit hook registered when the row is
    saved, in this process only. Keyed by the decision's request id, or the run's id."""

    def __init__(self):
        from django.db import transaction
        from django.db.models.signals import post_save

        from policy.models import Decision
        from runs.models import Run

        self.decisions: dict[int, float] = {}
        self.runs: dict[int, float] = {}

        def stamp(table: dict, key: int) -> None:
            transaction.on_commit(lambda: table.__setitem__(key, time.time()))

        # The rows are saved before the services add their outbox rows, so these hooks run before the
        # message is sent.
        def decision_saved(instance, created, **_):
            if created:
                stamp(self.decisions, instance.request_id)

        def run_saved(instance, created, **_):
            if created:
                stamp(self.runs, instance.id)

        post_save.connect(decision_saved, sender=Decision, weak=False, dispatch_uid="bench-decision-commit")
        post_save.connect(run_saved, sender=Run, weak=False, dispatch_uid="bench-run-commit")


def wait_until(check, timeout: float, what: str, interval: float = 0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(interval)
    raise SystemExit(f"timed out waiting for {what}")


def run_finished(run_id: int) -> bool:
    from runs.models import Run

    status = Run.objects.filter(id=run_id).values_list("status", flat=True).get()
    if status in Run.TERMINAL or status == Run.Status.NEEDS_ATTENTION:
        if status != Run.Status.COMPLETED:
            raise SystemExit(f"run {run_id} ended {status}")
        return True
    return False


def park(operator, n: int) -> dict[int, int]:
    """Start ``n`` gated runs and wait until each has parked on its call: {run id: approval request id}."""
    from policy.models import ApprovalRequest
    from runs.models import Task
    from runs.services import run_start

    run_ids = [run_start(workflow="bench-appr", started_by=operator).id for _ in range(n)]

    def all_parked():
        parked = Task.objects.filter(run_id__in=run_ids, status=Task.Status.WAITING_FOR_APPROVAL).count()
        return parked == n

    wait_until(all_parked, 60 + n * 0.5, f"{n} runs to park on their approval", interval=0.05)
    requests = ApprovalRequest.objects.filter(run_id__in=run_ids, status="pending")
    return dict(requests.values_list("run_id", "id"))


# --- the measurement -------------------------------------------------------------------------------------------
def measure(args, operator, token: str, worker_pids: list[int]) -> dict:
    from django.test import Client

    from runs.services import run_start

    client = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {token}")
    rnd = random.Random(7)

    def decide(run_id: int) -> float:
        """As a reviewer's client: read the run's request (the hash it shows), then approve quoting it.
        Returns the POST's time in ms."""
        request_id = to_decide[run_id]
        seen = client.get(f"/api/v1/approvals?run={run_id}&status=pending")
        (item,) = [a for a in seen.json() if a["id"] == request_id]
        t = time.perf_counter()
        answer = client.post(
            f"/api/v1/approvals/{request_id}/decision",
            {"decision": "approve", "arguments_hash": item["arguments_hash"], "note": "bench"},
            content_type="application/json",
        )
        elapsed = (time.perf_counter() - t) * 1000
        if answer.status_code != 200:
            raise SystemExit(f"the decision was refused: HTTP {answer.status_code} {answer.content[:300]!r}")
        return elapsed

    def idle():
        # The workers go idle between samples (a reviewer takes seconds at least): each commit lands at
        # a random moment of their queue polling, which backs off to WARDEN_QUEUE_POLL_MS when idle.
        time.sleep(rnd.uniform(args.idle_min, args.idle_max))

    print(f"    parking {args.warmup + args.decisions} runs on their approval …", flush=True)
    to_decide = park(operator, args.warmup + args.decisions)
    order = sorted(to_decide)

    # Warm-up, not measured: every worker thread's first message opens its database connection.
    warm = [run_start(workflow="bench-appr-ref", started_by=operator).id for _ in range(2 * args.threads)]
    for run_id in warm:
        wait_until(lambda run_id=run_id: run_finished(run_id), 30, "the warm-up runs")
    for run_id in order[: args.warmup]:
        decide(run_id)
        wait_until(lambda run_id=run_id: run_finished(run_id), 30, "a warm-up decision's run")

    print(f"    {args.decisions} decisions and {args.decisions} bare starts, interleaved …", flush=True)
    measured, references, api_ms = order[args.warmup :], [], []
    cpu0, t0 = cpu_seconds(worker_pids), time.monotonic()
    for i, run_id in enumerate(measured):
        for kind in ("ref", "decision") if i % 2 == 0 else ("decision", "ref"):
            idle()
            if kind == "ref":
                ref = run_start(workflow="bench-appr-ref", started_by=operator).id
                references.append(ref)
                wait_until(lambda ref=ref: run_finished(ref), 30, f"reference run {ref}")
            else:
                api_ms.append(decide(run_id))
                wait_until(lambda run_id=run_id: run_finished(run_id), 30, f"run {run_id} to resume and finish")
        if (i + 1) % max(1, len(measured) // 5) == 0:
            print(f"    {i + 1} of {len(measured)}", flush=True)
    cpu, wall = cpu_seconds(worker_pids) - cpu0, time.monotonic() - t0
    return {
        "measured": measured,
        "requests": to_decide,
        "references": references,
        "api_ms": api_ms,
        "cpu": cpu,
        "wall": wall,
    }


def latencies(m: dict, stamps: CommitStamps) -> dict:
    """Everything from the database, against the commit stamps taken in this process."""
    from policy.models import Decision
    from runs.models import Span
    from tools.models import ToolOperation

    def ms(later, earlier: float) -> float:
        return (later.timestamp() - earlier) * 1000

    runs, requests = m["measured"], m["requests"]
    ops = dict(
        ToolOperation.objects.filter(run_id__in=runs, tool=TOOL, status="committed").values_list("run_id", "started_at")
    )
    steps = dict(Span.objects.filter(run_id__in=runs, kind=Span.Kind.TOOL_CALL).values_list("run_id", "started_at"))
    decided = dict(Decision.objects.filter(request_id__in=[requests[r] for r in runs]).values_list("request_id", "at"))
    missing = [r for r in runs if r not in ops or r not in steps or requests[r] not in stamps.decisions]
    if missing:
        raise SystemExit(f"{len(missing)} decisions left no executed call or no commit stamp: runs {missing[:5]}")
    commit = {r: stamps.decisions[requests[r]] for r in runs}
    attempts = dict(
        Span.objects.filter(run_id__in=m["references"], kind=Span.Kind.ATTEMPT).values_list("run_id", "started_at")
    )
    first_steps = dict(
        Span.objects.filter(run_id__in=m["references"], kind=Span.Kind.MODEL_CALL).values_list("run_id", "started_at")
    )
    return {
        "call": [ms(ops[r], commit[r]) for r in runs],
        "step": [ms(steps[r], commit[r]) for r in runs],
        # The decision row's own timestamp is taken inside its transaction, before the commit.
        "row_before_commit": [-ms(decided[requests[r]], commit[r]) for r in runs],
        "ref": [ms(attempts[r], stamps.runs[r]) for r in m["references"]],
        "ref_step": [ms(first_steps[r], stamps.runs[r]) for r in m["references"] if r in first_steps],
    }


# --- main ------------------------------------------------------------------------------------------------------
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decisions", type=int, default=200, help="approvals measured (and as many bare starts)")
    parser.add_argument("--warmup", type=int, default=3, help="decisions made first and not measured")
    parser.add_argument("--processes", type=int, default=2, help="worker processes")
    parser.add_argument("--threads", type=int, default=2, help="threads per worker process")
    parser.add_argument("--idle-min", type=float, default=0.25, help="seconds the workers stay idle between samples")
    parser.add_argument("--idle-max", type=float, default=0.5)
    parser.add_argument("--quick", action="store_true", help="a small version (a smoke check)")
    parser.add_argument("--database-url", default=os.environ.get("WARDEN_BENCH_APPR_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--redis-url", default=os.environ.get("WARDEN_BENCH_REDIS_URL", DEFAULT_REDIS))
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures (bench/run.py)")
    args = parser.parse_args()
    if args.quick:
        args.decisions, args.warmup = 20, 2

    db_name = urlparse(args.database_url).path.lstrip("/")
    if "bench" not in db_name:
        raise SystemExit(f"refusing to drop and recreate {db_name!r}: give a database whose name says bench")
    namespace = f"warden-bench-appr-{os.getpid()}"
    os.environ.update(
        DATABASE_URL=args.database_url,
        REDIS_URL=args.redis_url,
        WARDEN_QUEUE_NAMESPACE=namespace,
        DJANGO_SETTINGS_MODULE="config.settings.base",
        DJANGO_SECRET_KEY=os.urandom(24).hex(),  # one key for this process and the workers (arguments hashes)
        DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
        DJANGO_EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend",  # reviewers' e-mails stay here
        WARDEN_API_RATE_PER_MINUTE="1000000",
        WARDEN_LOG_LEVEL=os.environ.get("WARDEN_LOG_LEVEL", "WARNING"),
    )
    os.environ.pop("WARDEN_APPROVAL_WEBHOOK_URL", None)
    log_dir = Path(f"/tmp/warden-bench-appr-{os.getpid()}")
    log_dir.mkdir(exist_ok=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds like Ctrl-C: workers stopped, database dropped
    from django.db import DatabaseError
    from redis import RedisError

    db_create(args.database_url)
    workers = None
    load_start = Path("/proc/loadavg").read_text().split()[:3]
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        workflows()
        operator, token = people()
        stamps = CommitStamps()
        threads = f"{args.processes}×{args.threads} worker threads"
        print(f"approval to resume: {args.decisions} decisions, {threads} …", flush=True)
        workers = workers_start(args.processes, args.threads, log_dir / "workers.log")
        pids = [workers.pid, *children(workers.pid)]
        m = measure(args, operator, token, pids)
        memory = [rss_mb(pid) for pid in pids if Path(f"/proc/{pid}").exists()]
        lat = latencies(m, stamps)
    except (DatabaseError, RedisError) as exc:
        raise SystemExit(f"PostgreSQL or Redis went away during the benchmark ({exc!r:.200}); run it again") from exc
    finally:
        if workers is not None:
            kill_group(workers, grace=20)
        from django.db import connections

        best_effort("close the database connections", connections.close_all, attempts=1)
        best_effort(f"forget the Redis keys of {namespace}", redis_forget, args.redis_url, namespace)
        if not args.keep:
            best_effort(f"drop the database {db_name}", db_drop, args.database_url)
    shutil.rmtree(log_dir, ignore_errors=True)  # kept when something failed: the workers' log is there

    call, ref, step = p50_p99(lat["call"]), p50_p99(lat["ref"]), p50_p99(lat["step"])
    n = len(lat["call"])
    rows = [
        (
            f"approval → resume p50 / p99 ({n} decisions)",
            f"{call[0]:.1f} / {call[1]:.1f} ms",
            f"bare message {ref[0]:.1f} / {ref[1]:.1f} ms",
            f"{call[0] / ref[0]:.1f}× / {call[1] / ref[1]:.1f}×",
            "P9: p50 ≤ 10 ms",
        )
    ]
    api, row_early = p50_p99(m["api_ms"]), statistics.median(lat["row_before_commit"])
    ref_step = p50_p99(lat["ref_step"]) if lat["ref_step"] else (float("nan"), float("nan"))
    load_end = Path("/proc/loadavg").read_text().split()[:3]
    notes = [
        "approval → resume: from the decision's commit to the approved call's start on a worker "
        "(ToolOperation.started_at); bare message: from a one-task run's commit to a worker's pick-up of it "
        "(its attempt span's started_at); interleaved, idle workers "
        f"({args.idle_min:g}–{args.idle_max:g} s between samples), {threads}",
        f"decision commit → the parked task's next step starts (tool-call span) {step[0]:.1f} / {step[1]:.1f} ms; "
        f"bare start → the new task's first step (model call) {ref_step[0]:.1f} / {ref_step[1]:.1f} ms",
        f"the reviewer's POST (in-process API client) {api[0]:.1f} / {api[1]:.1f} ms; the Decision row's "
        f"timestamp is {row_early:.1f} ms (median) before its commit",
        f"worker CPU {m['cpu']:.2f} s over {m['wall']:.1f} s for {n} resumes and {len(lat['ref'])} bare starts; "
        f"worker processes RSS {' + '.join(f'{mb:.0f}' for mb in memory)} MB",
        f"load average (1, 5, 15 min): {' '.join(load_start)} at the start, {' '.join(load_end)} at the end; "
        f"{os.cpu_count()} cores",
    ]
    header = ("figure", "value", "reference", "ratio", "goal")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(5)]
    print()
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    print()
    for note in notes:
        print(note)
    if args.json:
        figures = {
            "decisions": n,
            "resume_p50_ms": call[0],
            "resume_p99_ms": call[1],
            "bare_message_p50_ms": ref[0],
            "bare_message_p99_ms": ref[1],
            "next_step_p50_ms": step[0],
            "next_step_p99_ms": step[1],
            "decision_api_p50_ms": api[0],
            "decision_api_p99_ms": api[1],
            "worker_rss_mb": memory,
        }
        print(json.dumps({"bench": "approvals", "rows": rows, "notes": notes, "figures": figures}, ensure_ascii=False))


def redis_forget(url: str, namespace: str) -> None:
    """Our queues and cache keys (both are prefixed with the queue namespace)."""
    import redis

    client = redis.Redis.from_url(url)
    for key in client.scan_iter(f"{namespace}:*"):
        client.delete(key)


if __name__ == "__main__":
    main()
