"""What-if replays (docs/replay.md): what replaying recorded runs costs beside what the runs cost.

On the demo's incident-fanout workflow (a supervisor plans five workers that each read a CRM record,
open a ticket, update the record and e-mail the customer, then a summary: 47 steps and 20 tool calls a
run), with the scripted model provider:

  1. 100 original runs, started one after the other, executed by the workers: their engine time, the
     wall time from the first run's start to the last one's settlement (the runs' own timestamps), and
     the sum of the runs' durations;
  2. a replay of all 100 on the unchanged incident-worker version (``replay_start``): its wall time from
     the call to ``replay_settled``, the model-call time inside it (the sum of the replay runs' model-call
     span durations) and its differences (``replay_diff``: 0 expected).

    .venv/bin/python bench/replay.py [--runs 100] [--quick] [--json]                  # embedded mode
    .venv/bin/python bench/replay.py --modes embedded,postgres \\
        --database-url postgres://postgres@127.0.0.1:5432/warden_bench_replay --redis-url redis://127.0.0.1:6379/13

Goal R1: a replay of 100 recorded runs takes at most its model calls plus 110% of the originals' engine
time. A replay runs each original again with the same number of steps, but its model calls are the
candidate's real ones (compared, paid for), while its tool calls are answered from the original's ledger
instead of sent. So the goal reads: the replay's own time beyond its model calls is at most 10% above
the engine time the originals took, that is replay ≤ model calls + 1.10 × originals. With the scripted
provider the model calls cost almost nothing, so it nearly says the replay is at most 1.10× the
originals. The script prints both times, the model-call time, the ratio replay ÷ originals and whether
the goal is met.

Each mode runs in a child process of its own. Embedded (the default): SQLite (WAL) in a temporary folder
and 4 in-process worker threads, as `manage.py serve` runs them; nothing is contacted. PostgreSQL +
Redis (``--modes …,postgres``; only 127.0.0.1): a database of its own, dropped and recreated, dropped
again at the end unless --keep, a queue namespace of its own (its keys forgotten at the end) and 2 × 2
`rundramatiq` worker threads, as bench/engine.py's (2).
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# The project before bench/ (where Python put this script's folder): this script has the replay app's name.
sys.path.insert(0, str(ROOT))

MODES = ("embedded", "postgres")
LABELS = {"embedded": "embedded", "postgres": "PostgreSQL"}
GOAL = "R1 replay of 100 recorded runs ≤ model calls + 10% of the originals' engine time"
SHADOW_GOAL = "S1 production steps/s with a shadow following every run ≥ 0.9× without"
SHADOW_FLOOR = 0.9
SLACK = 1.10
POLL_SECONDS = 0.02  # how often settlement is asked: the replay's time is known to this much


# --- in a child: one mode ----------------------------------------------------------------------------------
def settled(run_ids) -> bool:
    from replay.services import SETTLED
    from runs.models import Run

    statuses = Run.objects.filter(id__in=run_ids).values_list("status", flat=True)
    return all(status in SETTLED for status in statuses)


def wait(predicate, what: str, timeout: float = 1800) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} did not settle in {timeout:.0f} s")
        time.sleep(POLL_SECONDS)


def originals(n: int) -> list[int]:
    """``n`` incident-fanout runs, started one after the other (as a replay starts its runs), all
    completed."""
    from runs.models import Run
    from runs.services import run_start

    ids = [run_start(workflow="incident-fanout").id for _ in range(n)]
    wait(lambda: settled(ids), f"{n} incident-fanout runs")
    bad = list(Run.objects.filter(id__in=ids).exclude(status=Run.Status.COMPLETED).values_list("status", flat=True))
    if bad:
        raise SystemExit(f"original runs did not complete: {bad[:5]}")
    return ids


def replayed(run_ids: list[int], version: int):
    """The replay of ``run_ids`` on incident-worker ``version``, and its wall time until settled."""
    from replay.services import replay_settled, replay_start

    started = time.monotonic()
    replay = replay_start(run_ids=run_ids, agent="incident-worker", version=version, via="bench")
    wait(lambda: replay_settled(replay), f"the replay of {len(run_ids)} runs")
    return replay, time.monotonic() - started


def engine_time(run_ids) -> tuple[float, float, int]:
    """First start → last settlement, the sum of the runs' durations (seconds), and their steps."""
    from runs.models import Run

    runs = list(Run.objects.filter(id__in=run_ids).values_list("started_at", "finished_at", "steps_used"))
    wall = (max(r[1] for r in runs) - min(r[0] for r in runs)).total_seconds()
    return wall, sum((r[1] - r[0]).total_seconds() for r in runs), sum(r[2] for r in runs)


def span_seconds(run_ids, kind: str) -> tuple[float, int]:
    """The summed durations of the runs' spans of ``kind`` (the journal's: one per step), and their count."""
    from runs.models import Span

    found = Span.objects.filter(run_id__in=run_ids, kind=kind, step__isnull=False, ended_at__isnull=False)
    times = list(found.values_list("started_at", "ended_at"))
    return sum((end - start).total_seconds() for start, end in times), len(times)


def measure(args, workers) -> dict:
    """Both phases on a migrated database with the demo workflows; ``workers`` runs the attempts meanwhile."""
    from agents.models import AgentVersion
    from replay.services import replay_diff
    from runs.models import Run, Span
    from tools.models import SandboxCall

    version = AgentVersion.objects.filter(agent__slug="incident-worker", draft=False).order_by("-number").first()
    with workers():
        print("warm-up: 3 runs and their replay …", flush=True)
        replayed(originals(3), version.number)
        print(f"(1) {args.runs} incident-fanout runs …", flush=True)
        ids = originals(args.runs)
        sandbox = SandboxCall.objects.count()
        print(f"(2) their replay on incident-worker v{version.number} (unchanged) …", flush=True)
        replay, replay_s = replayed(ids, version.number)
        sandbox = SandboxCall.objects.count() - sandbox  # what the replay sent (none: its answers are recorded)
        print(f"(3) production throughput with and without a shadow, {args.shadow_rounds} alternated rounds "
              f"of {args.shadow_runs} runs …", flush=True)  # fmt: skip
        plain, shadowed, twins = shadowing(args, version.number)
    diff = replay_diff(replay)
    total = diff["total"]
    replay_ids = [pair["replay"] for pair in diff["runs"]]
    wall, summed, steps = engine_time(ids)
    replay_wall, replay_summed, replay_steps = engine_time(replay_ids)
    model_s, model_calls = span_seconds(replay_ids, Span.Kind.MODEL_CALL)
    tool_s, tool_calls = span_seconds(replay_ids, Span.Kind.TOOL_CALL)
    original_model_s, _ = span_seconds(ids, Span.Kind.MODEL_CALL)
    return {
        "runs": args.runs,
        "originals_engine_s": wall,
        "originals_run_seconds_sum": summed,
        "originals_steps": steps,
        "originals_model_call_s": original_model_s,
        "replay_s": replay_s,
        "replay_engine_s": replay_wall,
        "replay_run_seconds_sum": replay_summed,
        "replay_steps": replay_steps,
        "replay_model_call_s": model_s,
        "replay_model_calls": model_calls,
        "replay_tool_call_s": tool_s,
        "replay_tool_calls": tool_calls,
        "replay_vs_originals": replay_s / wall,
        # R1's left side over its right side's engine part: ≤ 1.10 when met.
        "replay_overhead_vs_originals": (replay_s - model_s) / wall,
        "replay_runs_completed": Run.objects.filter(id__in=replay_ids, status=Run.Status.COMPLETED).count(),
        "sandbox_calls_during_replay": sandbox,
        "diff_total": total,
        "production_steps_per_s": statistics.median(plain),
        "shadowed_steps_per_s": statistics.median(shadowed),
        "shadowed_vs_plain": statistics.median(shadowed) / statistics.median(plain),
        "shadow_rounds": [round(r) for r in plain] + [round(r) for r in shadowed],
        "twins_completed": twins,
    }


def production(n: int) -> tuple[float, list[int]]:
    """``n`` incident-fanout runs: their steps per second, first start → last settlement."""
    ids = originals(n)
    wall, _, steps = engine_time(ids)
    return steps / wall, ids


def shadowing(args, version: int) -> tuple[list[float], list[float], int]:
    """S1: production's steps/s without a shadow and with one (incident-worker ``version`` following every
    run), in alternated rounds; each shadowed round waits for its twins to end before the next begins."""
    from replay.shadows import shadow_off, shadow_on
    from runs.models import Run
    from tenancy.access import default_project

    plain, shadowed, twins = [], [], 0
    for round_ in range(args.shadow_rounds):
        for shadow_it in (False, True) if round_ % 2 == 0 else (True, False):
            if not shadow_it:
                plain.append(production(args.shadow_runs)[0])
                continue
            shadow = shadow_on(project=default_project(), workflow="incident-fanout", agent="incident-worker",
                               version=version, via="bench")  # fmt: skip
            rate, ids = production(args.shadow_runs)
            shadowed.append(rate)
            found = Run.objects.filter(replay_of_id__in=ids, mode=Run.Mode.SHADOW)
            wait(lambda found=found, ids=ids: found.count() == len(ids) and settled(found.values("id")),
                 f"the twins of {len(ids)} runs")  # fmt: skip
            twins += found.filter(status=Run.Status.COMPLETED).count()
            shadow_off(shadow=shadow, via="bench")
    return plain, shadowed, twins


def embedded(args) -> dict:
    """SQLite (in the child's folder) and worker threads in this process."""
    import dramatiq
    from django.core.management import call_command

    import runs.actors  # noqa: F401  (the actors the worker threads consume)
    from agents.demo import load_demo_workflows
    from approvals.policies import demo_waivers_load

    call_command("migrate", verbosity=0)
    load_demo_workflows()
    demo_waivers_load()

    @contextmanager
    def workers():
        worker = dramatiq.Worker(dramatiq.get_broker(), worker_threads=args.threads, worker_timeout=100)
        worker.start()
        try:
            yield
        finally:
            worker.stop()

    return {**measure(args, workers), "workers": f"{args.threads} threads in this process"}


def postgres(args) -> dict:
    """PostgreSQL and Redis, and ``rundramatiq`` worker processes (bench/engine.py's)."""
    from django.core.management import call_command
    from engine import Workers

    from agents.demo import load_demo_workflows
    from approvals.policies import demo_waivers_load

    call_command("migrate", verbosity=0)
    load_demo_workflows()
    demo_waivers_load()

    @contextmanager
    def workers():
        started = Workers(processes=2, threads=2)
        try:
            yield
        finally:
            started.stop()

    return {**measure(args, workers), "workers": "2 rundramatiq processes × 2 threads"}


def child(args) -> None:
    """One mode, in this process: its figures as the last line of the output."""
    for name in ("DATABASE_URL", "REDIS_URL", "PROMETHEUS_MULTIPROC_DIR"):
        os.environ.pop(name, None)
    folder = tempfile.mkdtemp(prefix=f"warden-bench-replay-{args.child}-")
    # The secret key, the metrics' files and (embedded) the database stay in this folder, removed at the end.
    os.environ.update(WARDEN_VAR_DIR=folder, DJANGO_SETTINGS_MODULE="config.settings.base")
    os.environ.setdefault("WARDEN_LOG_LEVEL", "WARNING")  # not a line per run's end
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: workers stopped, database dropped
    url = args.database_url
    try:
        if args.child == "embedded":
            os.environ.pop("WARDEN_QUEUE_NAMESPACE", None)
            os.environ["WARDEN_SQLITE_PATH"] = f"{folder}/warden.sqlite3"
        else:
            os.environ.update(DATABASE_URL=url, REDIS_URL=args.redis_url)
            from engine import ensure_database

            ensure_database(url)
        import django

        django.setup()
        figures = embedded(args) if args.child == "embedded" else postgres(args)
    finally:
        _child_cleanup(args, folder)
    print(json.dumps({"mode": args.child, "figures": figures}), flush=True)


def _child_cleanup(args, folder: str) -> None:
    import shutil

    from live_push import best_effort

    if "django.db" in sys.modules:
        from django.db import connections

        best_effort("close the database connections", connections.close_all, attempts=1)
    if args.child == "postgres":
        from engine import ensure_database, redis_forget

        namespace = os.environ["WARDEN_QUEUE_NAMESPACE"]
        best_effort(f"forget the Redis keys of {namespace}", redis_forget, args.redis_url, namespace)
        if not args.keep:
            best_effort(f"drop the database {args.database_url.rsplit('/', 1)[-1]}", ensure_database,
                        args.database_url, False)  # fmt: skip
    shutil.rmtree(folder, ignore_errors=True)


# --- the parent: each mode in a child, then the table ------------------------------------------------------
def run_mode(mode: str, args) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--runs", str(args.runs),
           "--threads", str(args.threads), "--shadow-runs", str(args.shadow_runs), "--shadow-rounds",
           str(args.shadow_rounds)]  # fmt: skip
    if mode == "postgres":
        cmd += ["--database-url", args.database_url, "--redis-url", args.redis_url] + (["--keep"] if args.keep else [])
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # The child's queue namespace is named after this process, which bench/run.py knows (and cleans up).
    env["WARDEN_QUEUE_NAMESPACE"] = f"warden-bench-replay-{os.getpid()}"
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, bufsize=1)
    found = None
    try:
        for line in proc.stdout:
            if line.startswith('{"mode"'):
                found = json.loads(line)["figures"]
            else:
                print(f"{LABELS[mode]}: {line}", end="", flush=True)
        code = proc.wait()
    finally:
        if proc.poll() is None:  # interrupted: the child stops its workers and drops its database
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if code != 0 or found is None:
        raise SystemExit(f"the {LABELS[mode]} measurement failed (exit code {code})")
    return found


def goal_met(f: dict) -> bool:
    return f["replay_s"] <= f["replay_model_call_s"] + SLACK * f["originals_engine_s"]


def shadow_goal_met(f: dict) -> bool:
    return f["shadowed_vs_plain"] >= SHADOW_FLOOR


def rows_of(mode: str, f: dict) -> list[tuple]:
    label, n, total = LABELS[mode], f["runs"], f["diff_total"]
    bound = f["replay_model_call_s"] + SLACK * f["originals_engine_s"]
    return [
        (f"{label}: {n} incident-fanout runs, first start → last settlement",
         f"{f['originals_engine_s']:,.1f} s", f"sum of run durations {f['originals_run_seconds_sum']:,.1f} s", "—",
         "—"),
        (f"{label}: their replay, replay_start → replay_settled", f"{f['replay_s']:,.1f} s",
         f"originals {f['originals_engine_s']:,.1f} s", f"{f['replay_vs_originals']:.2f}×",
         f"R1: ≤ {bound:,.1f} s ({'met' if goal_met(f) else 'NOT MET'})"),
        (f"{label}: model calls inside the replay (span durations)",
         f"{f['replay_model_call_s']:,.2f} s ({f['replay_model_calls']:,} calls)", "—", "—", "—"),
        (f"{label}: the replay's differences",
         f"{total['runs']} runs, {total['differing']} differing, calls added {total['calls_added']}, "
         f"removed {total['calls_removed']}", "—", "—", "0 differing"),
        (f"{label}: production steps/s with a shadow (median of rounds)", f"{f['shadowed_steps_per_s']:,.0f}",
         f"without {f['production_steps_per_s']:,.0f}", f"{f['shadowed_vs_plain']:.2f}×",
         f"S1: ≥ {SHADOW_FLOOR}× ({'met' if shadow_goal_met(f) else 'NOT MET'})"),
    ]  # fmt: skip


def notes_of(mode: str, f: dict) -> list[str]:
    return [
        f"{LABELS[mode]}: workers {f['workers']}; steps {f['originals_steps']:,} originals, {f['replay_steps']:,} "
        f"replay; the replay runs' own first start → last settlement {f['replay_engine_s']:,.1f} s (sum of run "
        f"durations {f['replay_run_seconds_sum']:,.1f} s); its {f['replay_tool_calls']:,} tool calls answered in "
        f"{f['replay_tool_call_s']:,.2f} s (span durations); the originals' model calls "
        f"{f['originals_model_call_s']:,.2f} s; {f['replay_runs_completed']} replay runs completed; "
        f"{f['sandbox_calls_during_replay']} sandbox requests during the replay",
        f"{LABELS[mode]}: shadow rounds' steps/s, without then with: {f['shadow_rounds']}; "
        f"{f['twins_completed']} twins completed",
    ]


def flat(mode: str, f: dict) -> dict:
    """bench/run.py's figures: numbers only, each named after its mode."""
    out = {f"{mode}_{k}": v for k, v in f.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    out[f"{mode}_replay_differing"] = f["diff_total"]["differing"]
    out[f"{mode}_r1_met"] = goal_met(f)
    out[f"{mode}_s1_met"] = shadow_goal_met(f)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--threads", type=int, default=4, help="embedded mode's worker threads")
    parser.add_argument("--shadow-runs", type=int, default=50, help="runs per round of the shadow measurement")
    parser.add_argument("--shadow-rounds", type=int, default=2, help="alternated rounds without and with a shadow")
    parser.add_argument("--modes", default="embedded", help="embedded, postgres, or both (comma-separated)")
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/warden_bench_replay")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--keep", action="store_true", help="keep the PostgreSQL database afterwards")
    parser.add_argument("--quick", action="store_true", help="20 runs: a smoke check")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures (bench/run.py)")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.runs, args.shadow_runs = 20, 10
    if args.child:
        return child(args)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if set(modes) - set(MODES):
        raise SystemExit(f"--modes: choose among {', '.join(MODES)}")
    if "postgres" in modes:
        for url, what in ((args.database_url, "PostgreSQL"), (args.redis_url, "Redis")):
            if urlparse(url).hostname not in {"127.0.0.1", "localhost", "::1"}:
                raise SystemExit(f"{what} must be on this machine (127.0.0.1)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds into run_mode's clean-up

    found = {mode: run_mode(mode, args) for mode in modes}
    rows = [row for mode, f in found.items() for row in rows_of(mode, f)]
    notes = [note for mode, f in found.items() for note in notes_of(mode, f)]
    print()
    for note in notes:
        print(note)
    header = ("figure", "value", "reference", "ratio", "goal")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(5)]
    print()
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    print()
    for mode, f in found.items():
        print(
            f"{GOAL} ({LABELS[mode]}): {'met' if goal_met(f) else 'NOT MET'}; replay {f['replay_s']:,.1f} s, "
            f"model calls {f['replay_model_call_s']:,.2f} s + {SLACK:.2f} × originals {f['originals_engine_s']:,.1f} s"
            f" = {f['replay_model_call_s'] + SLACK * f['originals_engine_s']:,.1f} s; replay ÷ originals "
            f"{f['replay_vs_originals']:.2f}×; {f['diff_total']['differing']} of {f['diff_total']['runs']} differing"
        )
        print(
            f"{SHADOW_GOAL} ({LABELS[mode]}): {'met' if shadow_goal_met(f) else 'NOT MET'}; "
            f"{f['shadowed_steps_per_s']:,.0f} with, {f['production_steps_per_s']:,.0f} without: "
            f"{f['shadowed_vs_plain']:.2f}×"
        )
    if args.json:
        figures = {k: v for mode, f in found.items() for k, v in flat(mode, f).items()}
        print(json.dumps({"bench": "replay", "rows": rows, "notes": notes, "figures": figures}, ensure_ascii=False))


if __name__ == "__main__":
    main()
