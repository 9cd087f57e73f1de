"""All of Warden's benchmarks in one command, one table of their figures, Warden beside its peers, and
the goals.

    .venv/bin/python bench/run.py [--quick] [--only engine,peers,approvals,dashboard,embedded,peers-sqlite,tools,replay]
    .venv/bin/python bench/run.py --against REF [--rounds 5] [--only engine,embedded]

Runs, one after the other and each in its own process: bench/engine.py (PostgreSQL + Redis, real
workers), bench/peers.py (the same workloads on DBOS, LangGraph + PostgresSaver and a naive two-commit
journal, on the same PostgreSQL), bench/approval_resume.py, bench/live_push.py, bench/embedded.py (the
engine on SQLite in one process), bench/peers.py --backend sqlite, bench/tool_calls.py (tool adapters beside
direct calls of the same services) and bench/replay.py (100 incident-fanout runs, then their what-if replay,
embedded and on PostgreSQL + Redis). Each PostgreSQL benchmark has its
own database (warden_bench_run_*: dropped and recreated, dropped at the end) and queue namespace on Redis
db 13, and starts and stops its own workers (the dashboard its ASGI server). Their output is shown as it
comes, prefixed with their name; each ends with one JSON line of its figures (--json), read here into the
tables: figure | value | reference measured in the same run | ratio | goal, then steps/s side by side
with the peers, then each goal (P1–P9, E1–E3, T1, R1: docs/benchmarks.md) met or not.

Only 127.0.0.1 is contacted: PostgreSQL and Redis must listen there. --quick runs small versions of
everything, a smoke check of a few minutes; without it, the figures of docs/benchmarks.md. The peers are
the optional `bench` extra (`pip install -e ".[bench]"`); without it their rows say "not installed".

--against REF compares this build with another: REF is checked out in a temporary git worktree, and the
two builds take turns (REF first, then this one, then this one, then REF, …) for --rounds rounds, so that
both meet the same hour of a machine whose speed drifts; each figure is printed as the two medians and
their ratio (this build ÷ REF; "WORSE" beyond 10% in the wrong direction). The engine runs one repetition
per round (the rounds are the repetitions). Use it for any change that touches the engine.
"""

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
BENCHES = ("engine", "peers", "approvals", "dashboard", "embedded", "peers-sqlite", "tools", "replay")
# Not bench/approval_resume.py: a script of that name would shadow the approvals app on sys.path.
SCRIPTS = {
    "engine": "engine.py",
    "peers": "peers.py",
    "approvals": "approval_resume.py",
    "dashboard": "live_push.py",
    "embedded": "embedded.py",
    "peers-sqlite": "peers.py",
    "tools": "tool_calls.py",  # not bench/tools.py: a script of that name would shadow the tools app
    "replay": "replay.py",  # it puts the project before bench/ on sys.path, so the replay app wins
}
DATABASES = {
    "engine": "warden_bench_run_engine",
    "approvals": "warden_bench_run_appr",
    "dashboard": "warden_bench_run_dash",
    "peers": "warden_bench_run_peers",
    "replay": "warden_bench_run_replay",
}
NAMESPACES = {
    "engine": "warden-bench",
    "approvals": "warden-bench-appr",
    "dashboard": "warden-bench-dash",
    "replay": "warden-bench-replay",
}
# Measured on SQLite in this process's children only: no database, no Redis keys to clean up after them.
LOCAL = {"embedded", "peers-sqlite", "tools"}
# Whatever the calling shell says, the benchmarks get their addresses from here only.
SCRUBBED = (
    "DATABASE_URL",
    "REDIS_URL",
    "WARDEN_QUEUE_NAMESPACE",
    "WARDEN_BENCH_DASH_DATABASE_URL",
    "WARDEN_BENCH_APPR_DATABASE_URL",
    "WARDEN_BENCH_REDIS_URL",
    "WARDEN_APPROVAL_WEBHOOK_URL",
)


class Interrupted(Exception):
    pass


def command(name: str, args, root: Path = ROOT) -> tuple[list[str], dict]:
    db = f"{args.postgres.rstrip('/')}/{DATABASES.get(name, '')}"
    cmd = [sys.executable, str(root / "bench" / SCRIPTS[name]), "--json"] + (["--quick"] if args.quick else [])
    if getattr(args, "against", None) and name in REPEATABLE:
        cmd += ["--repeat", "1"]  # the alternation's rounds are the repetitions
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    env["PYTHONUNBUFFERED"] = "1"
    if name == "engine":
        env.update(DATABASE_URL=db, REDIS_URL=args.redis_url)
    elif name == "peers":
        cmd += ["--database-url", db]
    elif name == "peers-sqlite":
        cmd += ["--backend", "sqlite"]
    elif name in LOCAL:
        pass
    elif name == "replay":  # embedded first, then PostgreSQL + Redis, as the engine's two benchmarks
        cmd += ["--modes", "embedded,postgres", "--database-url", db, "--redis-url", args.redis_url]
    else:
        cmd += ["--database-url", db, "--redis-url", args.redis_url]
    return cmd, env


def run_one(name: str, args, timeout: float, root: Path = ROOT) -> tuple[dict | None, int, float]:
    """Run one benchmark, echoing its output; returns its JSON figures (None if it failed), its exit code
    and its duration. An interruption or the timeout stops it with SIGTERM: it stops its own processes
    and drops its database on the way out."""
    cmd, env = command(name, args, root)
    started = time.monotonic()
    # Its own session: a Ctrl-C reaches this process only, which then asks the benchmark to stop, once.
    proc = subprocess.Popen(
        cmd,
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        bufsize=1,
        start_new_session=True,
    )

    def over_time():
        print(f"[run] {name} is over its time limit ({timeout:.0f} s): stopping it", flush=True)
        proc.send_signal(signal.SIGTERM)

    watchdog = threading.Timer(timeout, over_time)
    watchdog.start()
    result = None
    try:
        for line in proc.stdout:
            if line.startswith('{"bench"'):
                result = json.loads(line)
                continue
            print(f"[{name}] {line}", end="", flush=True)
        code = stop(proc)
    except BaseException:
        stop(proc)
        raise
    finally:
        watchdog.cancel()
        cleanup(name, args, proc.pid)
    return (result if code == 0 else None), code, time.monotonic() - started


def cleanup(name: str, args, pid: int) -> None:
    """What the benchmark should have cleaned up itself, in case it was killed."""
    from live_push import best_effort

    reap_leftovers()
    if name not in DATABASES:
        return
    best_effort(f"drop the database {DATABASES[name]}", drop_database, args.postgres, DATABASES[name])
    if name not in NAMESPACES:
        return
    namespace = f"{NAMESPACES[name]}-{pid}"
    best_effort(f"forget the Redis keys of {namespace}", forget_namespace, args.redis_url, namespace)


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)  # it stops a server, workers and viewers, then drops its database
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def become_subreaper() -> None:
    """Processes a benchmark leaves behind (its workers run in sessions of their own) become children of
    this process instead of init's, so that reap_leftovers can find them. Linux only; elsewhere a no-op."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def reap_leftovers() -> None:
    """Stop what a benchmark that was killed left behind: descendants re-parented to this process."""
    out = subprocess.run(["pgrep", "-P", str(os.getpid())], capture_output=True, text=True).stdout
    pids = [int(p) for p in out.split() if int(p) != os.getpid()]
    for pid in pids:
        print(f"[run] stopping process {pid}, left behind by a benchmark", flush=True)
        try:
            # The benchmarks start their servers and workers as the leaders of process groups.
            kill = os.killpg if os.getpgid(pid) == pid else os.kill
            for sig in (signal.SIGCONT, signal.SIGTERM):
                kill(pid, sig)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 20
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    break
            except ChildProcessError:
                break
            time.sleep(0.1)
        else:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def drop_database(postgres: str, name: str) -> None:
    import psycopg

    parts = urlparse(postgres)
    with psycopg.connect(
        host=parts.hostname, port=parts.port or 5432, user=parts.username or "postgres", dbname="postgres"
    ) as admin:
        admin.autocommit = True
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def forget_namespace(redis_url: str, namespace: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(f"{namespace}:*"):
        client.delete(key)


def loopback_only(url: str, what: str) -> None:
    host = urlparse(url).hostname
    if host not in LOOPBACK:
        raise SystemExit(f"{what} must be on this machine (127.0.0.1), not {host!r}")


def table(results: dict, codes: dict) -> list[tuple]:
    rows = []
    for name in results:
        found = results[name]
        if found is None:
            rows.append((f"{name}: failed", f"exit code {codes[name]}", "see its output above", "—", "—"))
            continue
        rows += [(f"{name}: {row[0]}", *row[1:]) for row in found["rows"]]
    return rows


def _fig(results: dict, bench: str, *path):
    """A figure from a benchmark's JSON, or None when the benchmark did not run or lacks it."""
    found = (results.get(bench) or {}).get("figures")
    for key in path:
        if not isinstance(found, dict):
            return None
        found = found.get(key)
    return found


def _rate(results: dict, bench: str, peer: str, workload: str):
    return _fig(results, bench, peer, workload, "steps_per_s")


def versus(results: dict) -> list[tuple]:
    """Warden beside DBOS, LangGraph and the naive journal, workload by workload, with the ratios."""
    rows = []
    for mode, warden, peers in (("PostgreSQL", "engine", "peers"), ("SQLite (embedded)", "embedded", "peers-sqlite")):
        for n, workload, label in ((1, "long", "one run of many steps"), (2, "many", "many runs of 10 steps")):
            mine = _fig(results, warden, f"steps_per_s_{n}")
            if mine is None:
                continue
            cells = [f"{mode}: ({n}) {label}", f"{mine:,.0f}"]
            for peer in ("dbos", "langgraph", "journal"):
                theirs = _rate(results, peers, peer, workload)
                status = _fig(results, peers, peer, "status")
                if theirs:
                    cells.append(f"{theirs:,.0f} ({mine / theirs:.2f}×)")
                else:
                    cells.append(status or "not measured")
            rows.append(tuple(cells))
    return rows


def _ratio(results, warden, n, peers, peer, workload):
    mine, theirs = _fig(results, warden, f"steps_per_s_{n}"), _rate(results, peers, peer, workload)
    return mine / theirs if mine and theirs else None


# (goal, what, how the value reads, the value from the results, met?)
GOALS = (
    ("P1", "(1) ÷ DBOS ≥ 5×", lambda r: _ratio(r, "engine", 1, "peers", "dbos", "long"), lambda v: v >= 5),
    ("P1", "(1) ÷ LangGraph ≥ 3×", lambda r: _ratio(r, "engine", 1, "peers", "langgraph", "long"), lambda v: v >= 3),
    ("P2", "(2) ÷ DBOS ≥ 4×", lambda r: _ratio(r, "engine", 2, "peers", "dbos", "many"), lambda v: v >= 4),
    ("P2", "(2) ÷ LangGraph ≥ 2.5×",
     lambda r: _ratio(r, "engine", 2, "peers", "langgraph", "many"), lambda v: v >= 2.5),
    ("P2", "(2) ÷ naive journal ≥ 0.7×",
     lambda r: _ratio(r, "engine", 2, "peers", "journal", "many"), lambda v: v >= 0.7),
    ("P3", "hop p50 ≤ 2 ms", lambda r: _fig(r, "engine", "hop_p50_ms"), lambda v: v <= 2),
    ("P4", "worker CPU per step (1) ≤ 0.25 ms", lambda r: _fig(r, "engine", "cpu_ms_per_step_1"), lambda v: v <= 0.25),
    ("P4", "worker CPU per step (2) ≤ 0.35 ms", lambda r: _fig(r, "engine", "cpu_ms_per_step_2"), lambda v: v <= 0.35),
    (
        "P5",
        "push p50 ≤ 1.3× bare group_send",
        lambda r: _quotient(_fig(r, "dashboard", "push_p50_ms"), _fig(r, "dashboard", "bare_group_send_p50_ms")),
        lambda v: v <= 1.3,
    ),
    (
        "P5",
        "push p99 ≤ 1.2× bare group_send",
        lambda r: _quotient(_fig(r, "dashboard", "push_p99_ms"), _fig(r, "dashboard", "bare_group_send_p99_ms")),
        lambda v: v <= 1.2,
    ),
    ("P5", "pushes lost = 0", lambda r: _fig(r, "dashboard", "pushes_lost"), lambda v: v == 0),
    (
        "P6",
        "steps/s with 50 viewers ≥ 0.9× without",
        lambda r: _quotient(_fig(r, "dashboard", "steps_per_s_watched"), _fig(r, "dashboard", "steps_per_s_unwatched")),
        lambda v: v >= 0.9,
    ),
    ("P7", "run page (10,000 tasks) ≤ 600 ms", lambda r: _fig(r, "dashboard", "run_page_ms"), lambda v: v <= 600),
    (
        "P8",
        "runs list (1,000,000 runs), slowest page ≤ 50 ms",
        lambda r: _slowest_list(r),
        lambda v: v <= 50,
    ),
    ("P9", "approval → resume p50 ≤ 10 ms", lambda r: _fig(r, "approvals", "resume_p50_ms"), lambda v: v <= 10),
    ("T1", "HTTP tool ≤ 1.3× a direct call, p50", lambda r: _fig(r, "tools", "http_tool_vs_direct_p50"),
     lambda v: v <= 1.3),
    ("T1", "MCP tool (HTTP) ≤ 1.3× a direct call, p50", lambda r: _fig(r, "tools", "mcp_http_vs_direct_p50"),
     lambda v: v <= 1.3),
    ("T1", "MCP tool (stdio) ≤ 1.3× a direct call, p50", lambda r: _fig(r, "tools", "mcp_stdio_vs_direct_p50"),
     lambda v: v <= 1.3),
    ("E1", "embedded (1) ÷ DBOS on SQLite ≥ 5×", lambda r: _ratio(r, "embedded", 1, "peers-sqlite", "dbos", "long"),
     lambda v: v >= 5),
    ("E1", "embedded (1) ÷ LangGraph on SQLite ≥ 2×",
     lambda r: _ratio(r, "embedded", 1, "peers-sqlite", "langgraph", "long"), lambda v: v >= 2),
    ("E1", "embedded (1) ÷ naive SQLite journal ≥ 1×",
     lambda r: _ratio(r, "embedded", 1, "peers-sqlite", "journal", "long"), lambda v: v >= 1),
    ("E2", "embedded (2) ÷ DBOS on SQLite ≥ 2×", lambda r: _ratio(r, "embedded", 2, "peers-sqlite", "dbos", "many"),
     lambda v: v >= 2),
    ("E2", "embedded (2) ÷ LangGraph on SQLite ≥ 1×",
     lambda r: _ratio(r, "embedded", 2, "peers-sqlite", "langgraph", "many"), lambda v: v >= 1),
    ("E2", "embedded (2) ÷ naive SQLite journal ≥ 0.5×",
     lambda r: _ratio(r, "embedded", 2, "peers-sqlite", "journal", "many"), lambda v: v >= 0.5),
    ("E3", "embedded hop p50 ≤ 2 ms", lambda r: _fig(r, "embedded", "hop_p50_ms"), lambda v: v <= 2),
    # R1 reads (replay − its model calls) ÷ the originals' engine time: ≤ 1.10 (bench/replay.py).
    ("R1", "replay of 100 runs ≤ model calls + 1.10× originals, embedded",
     lambda r: _fig(r, "replay", "embedded_replay_overhead_vs_originals"), lambda v: v <= 1.10),
    ("R1", "replay of 100 runs ≤ model calls + 1.10× originals, PostgreSQL",
     lambda r: _fig(r, "replay", "postgres_replay_overhead_vs_originals"), lambda v: v <= 1.10),
    # S1: production's steps/s with a shadow following every run, over without (bench/replay.py).
    ("S1", "steps/s with a shadow ≥ 0.9× without, embedded",
     lambda r: _fig(r, "replay", "embedded_shadowed_vs_plain"), lambda v: v >= 0.9),
    ("S1", "steps/s with a shadow ≥ 0.9× without, PostgreSQL",
     lambda r: _fig(r, "replay", "postgres_shadowed_vs_plain"), lambda v: v >= 0.9),
)  # fmt: skip


def _quotient(a, b):
    return a / b if a is not None and b else None


def _slowest_list(results: dict):
    found = (results.get("dashboard") or {}).get("figures") or {}
    pages = [v for k, v in found.items() if k.startswith("runs_list_ms")]
    return max(pages) if pages else None


def goals(results: dict) -> list[tuple]:
    rows = []
    for goal, what, value, met in GOALS:
        found = value(results)
        if found is None:
            rows.append((goal, what, "not measured", "—"))
            continue
        shown = f"{found:.2f}" if isinstance(found, float) else str(found)
        rows.append((goal, what, shown, "met" if met(found) else "NOT MET"))
    return rows


# Benchmarks whose figures depend on the build (the peers' do not) and that take --repeat.
BUILD_DEPENDENT = ("engine", "approvals", "dashboard", "embedded")
REPEATABLE = ("engine", "embedded")


def worktree(ref: str) -> Path:
    """REF checked out beside this one (a detached git worktree in a temporary directory). It runs on this
    interpreter and its installed packages: a REF whose pyproject.toml differs is said so, not installed."""
    import tempfile

    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{ref}^{{commit}}"], capture_output=True, text=True
    )
    if commit.returncode != 0:
        raise SystemExit(f"--against {ref}: not a commit of this repository ({commit.stderr.strip()})")
    path = Path(tempfile.mkdtemp(prefix="warden-against-"))
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--quiet", "--detach", str(path), commit.stdout.strip()],
        check=True,
    )
    if (path / "pyproject.toml").read_bytes() != (ROOT / "pyproject.toml").read_bytes():
        print(f"[run] note: {ref}'s pyproject.toml differs; it runs on this build's installed packages", flush=True)
    return path


def worktree_remove(path: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], capture_output=True)
    subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True)


def numeric_figures(result: dict | None) -> dict[str, float]:
    found = (result or {}).get("figures") or {}
    return {k: float(v) for k, v in found.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def higher_is_better(figure: str) -> bool | None:
    """Rates (``…_per_s``) are better higher; times (``…_ms…``, CPU per step included) and losses lower."""
    if figure.endswith("_ms") or "_ms_" in figure or "lost" in figure:
        return False
    if figure.endswith("_per_s") or "_per_s_" in figure:
        return True
    return None


def alternate(names: list[str], args, timeout: float, ref_root: Path) -> dict:
    """Each round runs every benchmark on both builds, one after the other, the order swapped each round
    (REF first in odd rounds), so both see the same hour of this machine; the figures are the medians of
    the rounds. Returns {bench: {figure: {"ref": [...], "head": [...]}}}."""
    builds = {"ref": ref_root, "head": ROOT}
    seen: dict = {name: {} for name in names}
    for round_ in range(1, args.rounds + 1):
        order = ("ref", "head") if round_ % 2 else ("head", "ref")
        for name in names:
            for build in order:
                label = args.against if build == "ref" else "this build"
                print(f"\n[run] round {round_}/{args.rounds}: {name} on {label} …", flush=True)
                result, code, took = run_one(name, args, timeout, builds[build])
                if code != 0:
                    raise SystemExit(f"[run] {name} failed on {label} (exit code {code}): no comparison")
                print(f"[run] {name} on {label}: done in {took:.0f} s", flush=True)
                for figure, value in numeric_figures(result).items():
                    seen[name].setdefault(figure, {"ref": [], "head": []})[build].append(value)
    return seen


def comparison_rows(seen: dict) -> list[tuple]:
    import statistics

    rows = []
    for name, figures in seen.items():
        for figure, values in figures.items():
            if not values["ref"] or not values["head"]:
                continue
            ref, head = statistics.median(values["ref"]), statistics.median(values["head"])
            ratio = head / ref if ref else None
            better = higher_is_better(figure)
            if ratio is None or better is None:
                verdict = "—"
            elif abs(ratio - 1) <= 0.10:
                verdict = "within 10%"
            else:
                verdict = "better" if (ratio > 1) == better else "WORSE"
            rows.append(
                (
                    f"{name}: {figure}",
                    f"{ref:,.3f}",
                    f"{head:,.3f}",
                    "—" if ratio is None else f"{ratio:.2f}×",
                    verdict,
                    " ".join(f"{v:,.3g}" for v in values["ref"])
                    + " | "
                    + " ".join(f"{v:,.3g}" for v in values["head"]),
                )
            )
    return rows


def main_against(names: list[str], args, timeout: float) -> None:
    names = [n for n in names if n in BUILD_DEPENDENT]
    if not names:
        raise SystemExit(f"--against compares builds: choose among {', '.join(BUILD_DEPENDENT)} with --only")
    ref_root = worktree(args.against)
    started = time.monotonic()
    try:
        seen = alternate(names, args, timeout, ref_root)
    except (KeyboardInterrupt, Interrupted):
        print("\n[run] interrupted: the benchmark was stopped and its database dropped", flush=True)
        sys.exit(130)
    finally:
        worktree_remove(ref_root)
    print(f"\nthis build ({_head()}) against {args.against}, medians of {args.rounds} alternated rounds:")
    header = ("figure", args.against, "this build", "ratio", "", "rounds (ref | this)")
    print_table(header, comparison_rows(seen))
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(
        f"\ntook {time.monotonic() - started:.0f} s; load average (1, 5, 15 min) at the end {load};"
        f" {os.cpu_count()} cores"
    )
    if args.json:
        print(json.dumps({"against": args.against, "rounds": args.rounds, "figures": seen}))


def _head() -> str:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    ).stdout.strip()
    return out.stdout.strip() + (" + uncommitted changes" if dirty else "")


def print_table(header: tuple, rows: list[tuple]) -> None:
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    print()
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small versions of everything: a smoke check")
    parser.add_argument("--only", default=",".join(BENCHES), help="a comma-separated subset of " + ", ".join(BENCHES))
    parser.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432", help="server; no database name")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--timeout", type=float, help="seconds per benchmark (default 600 with --quick, else 3600)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of every figure")
    parser.add_argument(
        "--against",
        metavar="REF",
        help="compare this build with REF (a commit, tag or branch), checked out in a temporary worktree: the "
        "two builds alternate, each figure's median and ratio are printed (default --only engine,embedded)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="with --against: alternations of the two builds")
    args = parser.parse_args()
    if args.against and "--only" not in sys.argv:
        args.only = "engine,embedded"
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = set(names) - set(BENCHES)
    if unknown:
        raise SystemExit(f"unknown benchmarks: {', '.join(sorted(unknown))}")
    loopback_only(args.postgres, "PostgreSQL")
    loopback_only(args.redis_url, "Redis")
    timeout = args.timeout or (600 if args.quick else 3600)

    become_subreaper()

    def interrupted(*_):
        raise Interrupted()

    signal.signal(signal.SIGTERM, interrupted)
    if args.against:
        return main_against(names, args, timeout)
    started, load_start = time.monotonic(), Path("/proc/loadavg").read_text().split()[:3]
    results, codes, durations = {}, {}, {}
    try:
        for n, name in enumerate(names, 1):
            print(f"\n[run] {n}/{len(names)} {name}{' (quick)' if args.quick else ''} …", flush=True)
            results[name], codes[name], durations[name] = run_one(name, args, timeout)
            print(f"[run] {name}: {'done' if codes[name] == 0 else 'FAILED'} in {durations[name]:.0f} s", flush=True)
    except (KeyboardInterrupt, Interrupted):
        print("\n[run] interrupted: the benchmark was stopped and its database dropped", flush=True)
        sys.exit(130)

    print_table(("figure", "value", "reference", "ratio", "goal"), table(results, codes))
    side = versus(results)
    if side:
        print("\nsteps/s side by side (Warden ÷ peer in brackets):")
        print_table(("workload", "Warden", "DBOS", "LangGraph + its saver", "naive journal, 2 commits/step"), side)
    print("\ngoals:")
    print_table(("goal", "what", "measured", ""), goals(results))
    print()
    for name, found in results.items():
        for note in (found or {}).get("notes", []):
            print(f"{name}: {note}")
    load_end = Path("/proc/loadavg").read_text().split()[:3]
    took = ", ".join(f"{name} {durations[name]:.0f} s" for name in names)
    print(
        f"{'quick sizes; ' if args.quick else ''}took {time.monotonic() - started:.0f} s ({took}); load average "
        f"(1, 5, 15 min) {' '.join(load_start)} at the start, {' '.join(load_end)} at the end; {os.cpu_count()} cores"
    )
    if args.json:
        print(json.dumps({"quick": args.quick, "benches": results}, ensure_ascii=False))
    if any(code != 0 for code in codes.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
