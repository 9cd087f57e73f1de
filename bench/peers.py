"""The engine's two throughput workloads on the systems a user would pick instead of Warden, against the
same database server, and on a naive journal as the floor any durable engine should approach:

  (1) one run of 1,000 durable steps, one after the other;
  (2) 100 runs × 10 steps, four at a time.

  dbos       DBOS Transact: one @DBOS.workflow of @DBOS.step calls; (2) starts 100 workflows with
             DBOS.start_workflow and waits for their results (DBOS runs them on its own thread pool).
  langgraph  LangGraph with its PostgresSaver (SqliteSaver on SQLite), durability="sync": a one-node
             graph looped N times; (2) 100 threads of 10 steps, four invoked at a time.
  journal    raw psycopg (sqlite3 on SQLite): a run is one INSERT, then per step one INSERT into a journal
             and one UPDATE of the run's row, each its own commit; (2) on four threads, each with its
             own connection.

    .venv/bin/python bench/peers.py --database-url postgres://postgres@127.0.0.1:5432/warden_bench_peers \
        [--backend postgres|sqlite] [--only dbos,langgraph,journal] [--quick] [--json]

Each (peer, workload) is measured in a fresh process (DBOS keeps process-wide state), on a database that
is dropped and recreated first and dropped at the end (on SQLite: a file in a temporary folder). A peer
whose package is not installed (`pip install -e ".[bench]"`) has the row "not installed". Figures:
steps/s (median of --repeat) and the process's CPU per step. Only 127.0.0.1 is contacted.
"""

import argparse
import json
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

HERE = Path(__file__).resolve().parent
PEERS = ("dbos", "langgraph", "journal")
PACKAGES = {"dbos": "dbos", "langgraph": "langgraph.checkpoint.postgres", "journal": "psycopg"}
SQLITE_PACKAGES = {"dbos": "dbos", "langgraph": "langgraph.checkpoint.sqlite", "journal": "sqlite3"}
THREADS = 4  # (2)'s concurrency, as Warden's 2 × 2 worker threads


class Measured:
    """Steps, wall seconds and this process's CPU seconds of one workload."""

    def __init__(self):
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()

    def done(self, steps: int) -> dict:
        wall, cpu = time.perf_counter() - self.wall0, time.process_time() - self.cpu0
        return {"steps": steps, "seconds": wall, "steps_per_s": steps / wall, "cpu_ms_per_step": cpu / steps * 1000}


# --- DBOS -------------------------------------------------------------------------------------------------


def dbos_measure(url: str, workload: str, size: tuple[int, int], repeat: int) -> list[dict]:
    from dbos import DBOS

    DBOS(config={"name": "warden-bench-peer", "system_database_url": url, "log_level": "WARNING"})

    @DBOS.step()
    def step(i: int) -> int:
        return i

    @DBOS.workflow()
    def run(steps: int) -> int:
        for i in range(steps):
            step(i)
        return steps

    DBOS.launch()
    try:
        results = []
        for _ in range(repeat):
            runs, steps = size
            clock = Measured()
            if workload == "long":
                run(steps)
            else:
                handles = [DBOS.start_workflow(run, steps) for _ in range(runs)]
                for handle in handles:
                    handle.get_result()
            results.append(clock.done(runs * steps))
        return results
    finally:
        DBOS.destroy()


# --- LangGraph --------------------------------------------------------------------------------------------


def _graph(checkpointer):
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        i: int
        n: int

    def step(state: State) -> dict:
        return {"i": state["i"] + 1}

    builder = StateGraph(State)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", lambda s: "step" if s["i"] < s["n"] else END)
    return builder.compile(checkpointer=checkpointer)


def _saver(url: str):
    """LangGraph's own savers: PostgresSaver on a pool of THREADS connections, or SqliteSaver."""
    if url.startswith("sqlite:"):
        from langgraph.checkpoint.sqlite import SqliteSaver

        saver = SqliteSaver(sqlite3.connect(url.removeprefix("sqlite:///"), check_same_thread=False))
        saver.setup()
        return saver, lambda: saver.conn.close()
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    pool = ConnectionPool(
        url, min_size=THREADS, max_size=THREADS, kwargs={"autocommit": True, "row_factory": dict_row}, open=True
    )
    saver = PostgresSaver(pool)
    saver.setup()
    return saver, pool.close


def langgraph_measure(url: str, workload: str, size: tuple[int, int], repeat: int) -> list[dict]:
    saver, close = _saver(url)
    graph = _graph(saver)
    try:
        results = []
        for rep in range(repeat):
            runs, steps = size

            def invoke(thread: int, steps=steps, rep=rep) -> None:
                config = {"configurable": {"thread_id": f"r{rep}-t{thread}"}, "recursion_limit": steps + 10}
                graph.invoke({"i": 0, "n": steps}, config, durability="sync")

            clock = Measured()
            if workload == "long":
                invoke(0)
            else:
                with ThreadPoolExecutor(THREADS) as pool:
                    list(pool.map(invoke, range(runs)))
            results.append(clock.done(runs * steps))
        return results
    finally:
        close()


# --- the naive journal ------------------------------------------------------------------------------------


def _journal_connect(url: str):
    if url.startswith("sqlite:"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=30000")
        return conn, "?"
    import psycopg

    return psycopg.connect(url, autocommit=True), "%s"


def _journal_run(conn, p: str, run_id: int, steps: int) -> None:
    conn.execute(f"INSERT INTO runs (id) VALUES ({p})", (run_id,))  # the run's start: a commit too
    for i in range(steps):
        # Journal the step's result, then move the run on: two commits, as a durable engine must.
        conn.execute(f"INSERT INTO journal (run_id, step, output) VALUES ({p}, {p}, {p})", (run_id, i, '{"ok":1}'))
        conn.execute(f"UPDATE runs SET step = {p} WHERE id = {p}", (i + 1, run_id))


def _journal_threads(url: str, ids: list[int], steps: int) -> None:
    """The runs on THREADS threads, each with a connection of its own opened before the clock starts."""
    conns = [_journal_connect(url) for _ in range(THREADS)]
    clock = Measured()
    queue = list(reversed(ids))
    lock = threading.Lock()

    def worker(conn, p) -> None:
        while True:
            with lock:
                if not queue:
                    return
                run_id = queue.pop()
            _journal_run(conn, p, run_id, steps)

    threads = [threading.Thread(target=worker, args=c) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result = clock.done(len(ids) * steps)
    for conn, _ in conns:
        conn.close()
    return result


def journal_measure(url: str, workload: str, size: tuple[int, int], repeat: int) -> list[dict]:
    conn, p = _journal_connect(url)
    conn.execute("CREATE TABLE runs (id integer PRIMARY KEY, step integer NOT NULL DEFAULT 0)")
    conn.execute(
        "CREATE TABLE journal (run_id integer NOT NULL, step integer NOT NULL, output text NOT NULL,"
        " PRIMARY KEY (run_id, step))"
    )
    results, next_id = [], 0
    for _ in range(repeat):
        runs, steps = size
        ids = list(range(next_id, next_id + runs))
        next_id += runs
        if workload == "long":
            clock = Measured()
            _journal_run(conn, p, ids[0], steps)
            results.append(clock.done(steps))
        else:
            results.append(_journal_threads(url, ids, steps))
    conn.close()
    return results


MEASURES = {"dbos": dbos_measure, "langgraph": langgraph_measure, "journal": journal_measure}


# --- the driver -------------------------------------------------------------------------------------------


def fresh_database(url: str, create: bool = True) -> None:
    import psycopg

    parts = urlparse(url)
    name = parts.path.lstrip("/")
    with psycopg.connect(
        host=parts.hostname, port=parts.port or 5432, user=parts.username or "postgres", dbname="postgres"
    ) as admin:
        admin.autocommit = True
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if create:
            admin.execute(f'CREATE DATABASE "{name}"')


def installed(peer: str, backend: str) -> bool:
    import importlib.util

    module = (SQLITE_PACKAGES if backend == "sqlite" else PACKAGES)[peer]
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def one(args) -> None:
    """In a child process: one peer's one workload, printed as one JSON line."""
    size = (1, args.steps) if args.workload == "long" else (args.runs, args.run_steps)
    results = MEASURES[args.one](args.database_url, args.workload, size, args.repeat)
    print(json.dumps({"peer": args.one, "workload": args.workload, "results": results}), flush=True)


def _child(args, peer: str, workload: str, url: str) -> dict:
    cmd = [sys.executable, str(Path(__file__)), "--one", peer, "--workload", workload, "--database-url", url]
    cmd += ["--steps", str(args.steps), "--runs", str(args.runs), "--run-steps", str(args.run_steps)]
    cmd += ["--repeat", str(args.repeat)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith('{"peer"')]
    if proc.returncode or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{peer} {workload} failed (exit {proc.returncode}): {' / '.join(tail)}")
    return json.loads(lines[-1])


def measure_peer(args, peer: str, workload: str) -> dict:
    """A fresh database, the child's medians, the database dropped."""
    if args.backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="warden-bench-peer-") as folder:
            found = _child(args, peer, workload, f"sqlite:///{folder}/{peer}.sqlite3")
    else:
        fresh_database(args.database_url)
        try:
            found = _child(args, peer, workload, args.database_url)
        finally:
            fresh_database(args.database_url, create=False)
    results = found["results"]
    return {
        "steps_per_s": statistics.median(r["steps_per_s"] for r in results),
        "cpu_ms_per_step": statistics.median(r["cpu_ms_per_step"] for r in results),
        "repeats": [round(r["steps_per_s"], 1) for r in results],
    }


def measure_all(args) -> dict:
    """{peer: {"long": figures | None, "many": figures | None, "status": ...}}"""
    figures = {}
    for peer in args.peers:
        if not installed(peer, args.backend):
            figures[peer] = {"status": "not installed"}
            print(f"{peer}: not installed (pip install -e '.[bench]')", flush=True)
            continue
        figures[peer] = {"status": "ok"}
        for workload in ("long", "many"):
            label = f"1 × {args.steps} steps" if workload == "long" else f"{args.runs} × {args.run_steps} steps"
            print(f"{peer} on {args.backend}: {label}, {args.repeat}× …", flush=True)
            try:
                figures[peer][workload] = measure_peer(args, peer, workload)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                figures[peer][workload] = None
                figures[peer]["status"] = f"failed: {exc}"[:300]
                print(f"{peer}: {exc}", flush=True)
                continue
            got = figures[peer][workload]
            print(f"  {got['steps_per_s']:,.0f} steps/s, {got['cpu_ms_per_step']:.3f} ms CPU per step", flush=True)
    return figures


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/warden_bench_peers")
    p.add_argument("--backend", choices=["postgres", "sqlite"], default="postgres")
    p.add_argument("--only", default=",".join(PEERS), help="a comma-separated subset of " + ", ".join(PEERS))
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--run-steps", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600, help="seconds for each (peer, workload)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--one", choices=PEERS, help=argparse.SUPPRESS)
    p.add_argument("--workload", choices=["long", "many"], help=argparse.SUPPRESS)
    return p


def main() -> None:
    args = parser().parse_args()
    if args.one:
        return one(args)
    if args.quick:
        args.steps, args.runs, args.repeat = 300, 20, 1
    if args.backend == "postgres" and urlparse(args.database_url).hostname not in {"127.0.0.1", "localhost", "::1"}:
        raise SystemExit("the peers' database must be on this machine (127.0.0.1)")
    args.peers = [p.strip() for p in args.only.split(",") if p.strip()]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    figures = measure_all(args)
    rows = []
    for peer, found in figures.items():
        for workload, label in (("long", f"1 × {args.steps} steps"), ("many", f"{args.runs} × {args.run_steps} steps")):
            got = found.get(workload)
            value = f"{got['steps_per_s']:,.0f} steps/s" if got else found["status"][:60]
            cpu = f"{got['cpu_ms_per_step']:.3f} ms CPU/step" if got else "—"
            rows.append((f"{peer} on {args.backend}: {label}", value, cpu, "—", "—"))
    if args.json:
        print(json.dumps({"bench": "peers", "backend": args.backend, "rows": rows, "notes": [], "figures": figures}))


if __name__ == "__main__":
    main()
