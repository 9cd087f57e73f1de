"""What a tool call's adapter costs beside calling the same service directly, p50 and p99.

Three services on 127.0.0.1, each started here as a process of its own:

- a plain HTTP service (POST answers JSON): called directly with an httpx client kept for the run, by a
  Python (kit) tool whose function posts to it with that client, and by an HTTP tool declared as the admin
  declares one;
- the example MCP server (examples/refunds/tickets_mcp.py) over streamable HTTP and over stdio: called
  directly on a session the caller keeps open (the official SDK), from a synchronous thread as a worker's
  is (the goal's reference: the call crosses to the session's event loop and back) and, for the record,
  from inside the event loop (the fastest any caller gets); and by an MCP tool of Warden
  (tools/mcp_sessions.py keeps its session per process and server). For contrast, a stdio call on a
  session opened for the call, as Warden did before sessions were kept.

The calls being compared take turns in blocks (the order reversed every other round), so that each meets
the same moments of a machine whose speed drifts.

The figure is the adapter's: the tool's execute as the broker calls it (arguments in, the scrubbed answer
out), without the gate and the ledger (bench/broker.py measures those). Goal: the HTTP and MCP tools at
most 1.3× the direct call, p50.

    .venv/bin/python bench/tool_calls.py [--calls 300] [--quick] [--json]
"""

import argparse
import asyncio
import concurrent.futures
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
EXAMPLE = ROOT / "examples" / "refunds" / "tickets_mcp.py"
SERVICE = """
import http.server, json, sys
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        out = json.dumps({"ok": True, "echo": json.loads(body or b"{}")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port} after {timeout:g}s")


BLOCKS = 6  # each pair takes turns in blocks, so that both meet the same moments of a machine whose speed drifts


def _figures(times: list[float]) -> dict:
    times = sorted(times)
    return {"p50_ms": statistics.median(times), "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))]}


def block(call, n: int) -> list[float]:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return times


def turns(*measures, n: int) -> list[dict]:
    """Each measure (a function of a count returning that many times in ms), warmed, then in blocks that
    take turns, the order reversed every other round, n calls in all each."""
    for measure in measures:
        measure(10)
    seen, size = [[] for _ in measures], max(1, n // BLOCKS)
    for i in range(BLOCKS):
        order = list(enumerate(measures))
        for k, measure in order if i % 2 == 0 else reversed(order):
            seen[k].extend(measure(size))
    return [_figures(times) for times in seen]


class DirectMcp:
    """A direct caller's MCP session, kept open by a task on an event loop thread of its own; its calls are
    timed inside the loop (no thread crossing: the fastest a direct caller gets)."""

    def __init__(self, target):
        from mcp import Client

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        opened = concurrent.futures.Future()

        async def hold():
            self.done = asyncio.Event()
            async with Client(target, mode="legacy") as client:
                self.client = client
                opened.set_result(True)
                await self.done.wait()

        self.held = asyncio.run_coroutine_threadsafe(hold(), self.loop)
        opened.result(60)

    def times(self, n: int) -> list[float]:
        async def calls():
            times = []
            for _ in range(n):
                started = time.perf_counter()
                await self.client.call_tool("create_ticket", {"title": "direct"})
                times.append((time.perf_counter() - started) * 1000)
            return times

        return asyncio.run_coroutine_threadsafe(calls(), self.loop).result(120)

    def sync_times(self, n: int) -> list[float]:
        """The same calls made from a synchronous caller's thread (as a worker's is), crossing to the loop."""
        return block(
            lambda: asyncio.run_coroutine_threadsafe(
                self.client.call_tool("create_ticket", {"title": "direct"}), self.loop
            ).result(60),
            n,
        )

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.done.set)
        self.held.result(30)


def measure(args, http_port: int, mcp_port: int) -> dict:
    import httpx
    from pydantic import BaseModel

    from tools.http_tools import http_tool_spec
    from tools.kit import ToolClass, declared, tool
    from tools.mcp_sessions import mcp_sessions_close
    from tools.mcp_tools import _connection, _target
    from tools.mcp_tools import _execute as mcp_execute
    from tools.models import HttpTool, McpServer, McpTool

    url = f"http://127.0.0.1:{http_port}/comment"
    body = {"ticket_id": "TCK-1", "text": "refunded"}
    direct = httpx.Client()  # as a careful direct caller would: one client, its connections reused

    class Comment(BaseModel):
        ticket_id: str
        text: str

    class Answer(BaseModel):
        ok: bool
        echo: dict

    @tool("bench.comment", arguments=Comment, result=Answer, tool_class=ToolClass.IDEMPOTENT_WRITE)
    def comment(values: Comment, *, key: str, secrets: dict, deadline: float) -> dict:
        return direct.post(url, json=values.model_dump(), headers={"Idempotency-Key": key}, timeout=deadline).json()

    [kit] = [s for s in declared(__name__) if s.name == "bench.comment"]
    row = HttpTool(name="bench.comment", method="POST", url=url, idempotency_header="Idempotency-Key",
                   tool_class="idempotent_write", reversibility="irreversible", headers={})  # fmt: skip
    spec = http_tool_spec(row)

    def direct_http(n):
        return block(lambda: direct.post(url, json=body, timeout=10).json(), n)

    figures = {}
    figures["direct_http"], figures["kit"], figures["http_tool"] = turns(
        direct_http,
        lambda n: block(lambda: kit.execute(body, key="k", deadline=10, secrets={}), n),
        lambda n: block(lambda: spec.execute(body, key="k", deadline=10, secrets={}), n),
        n=args.calls,
    )
    for transport, fields in (
        ("http", {"url": f"http://127.0.0.1:{mcp_port}/mcp"}),
        ("stdio", {"command": "tickets"}),
    ):
        server = McpServer(id=1 if transport == "http" else 2, name="helpdesk", transport=transport, timeout_seconds=20,
                           **fields)  # fmt: skip
        mcp_row = McpTool(server=server, name="helpdesk.create_ticket", remote_name="create_ticket")
        mine = DirectMcp(_target(_connection(server, {}), sys.stderr))

        def warden(n, r=mcp_row):
            return block(lambda: mcp_execute(r, {"title": "warden"}, key="k", deadline=20, secrets={}), n)

        figures[f"direct_mcp_{transport}_in_loop"], figures[f"direct_mcp_{transport}"], figures[f"mcp_{transport}"] = (
            turns(mine.times, mine.sync_times, warden, n=args.calls)
        )
        mine.close()
    mcp_sessions_close()

    async def fresh_session():  # before: a session, and for stdio a server process, per call
        from mcp import Client

        async with Client(_target(_connection(server, {}), sys.stderr), mode="legacy") as client:
            await client.call_tool("create_ticket", {"title": "fresh"})

    figures["mcp_stdio_session_per_call"] = _figures(
        block(lambda: asyncio.run(fresh_session()), max(3, args.calls // 30))
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.calls = 150
    http_port, mcp_port = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="warden-bench-tools-") as folder:
        effects = f"{folder}/tickets.jsonl"
        for name in ("DATABASE_URL", "REDIS_URL", "WARDEN_QUEUE_NAMESPACE"):
            os.environ.pop(name, None)  # no database is read: the adapters are measured alone
        os.environ.update(
            WARDEN_SQLITE_PATH=f"{folder}/warden.sqlite3",
            DJANGO_SETTINGS_MODULE="config.settings.base",
            WARDEN_HTTP_TOOL_HOSTS="127.0.0.1",
            WARDEN_MCP_COMMANDS=json.dumps({"tickets": [sys.executable, str(EXAMPLE)]}),
            TICKETS_EFFECTS=effects,
        )
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        services = [
            subprocess.Popen([sys.executable, "-c", SERVICE, str(http_port)], **quiet),
            subprocess.Popen([sys.executable, str(EXAMPLE), "--http", str(mcp_port)], **quiet),
        ]
        try:
            wait_listening(http_port)
            wait_listening(mcp_port)
            import django

            django.setup()
            figures = measure(args, http_port, mcp_port)
        finally:
            for proc in services:
                proc.kill()
                proc.wait()
    pairs = [("kit", "direct_http"), ("http_tool", "direct_http"), ("mcp_http", "direct_mcp_http"),
             ("mcp_http", "direct_mcp_http_in_loop"), ("mcp_stdio", "direct_mcp_stdio"),
             ("mcp_stdio", "direct_mcp_stdio_in_loop"), ("mcp_stdio_session_per_call", "direct_mcp_stdio")]  # fmt: skip
    rows = []
    for name, direct in pairs:
        ratio = figures[name]["p50_ms"] / figures[direct]["p50_ms"]
        figures[f"{name}_vs_{direct}_p50"] = ratio
        if direct in ("direct_http", "direct_mcp_http", "direct_mcp_stdio"):
            figures[f"{name}_vs_direct_p50"] = ratio
        rows.append((name, f"{figures[name]['p50_ms']:.2f}", f"{figures[name]['p99_ms']:.2f}", direct,
                     f"{figures[direct]['p50_ms']:.2f}", f"{ratio:.2f}×"))  # fmt: skip
    goal = {("http_tool", "direct_http"): "T1: ≤ 1.3×", ("mcp_http", "direct_mcp_http"): "T1: ≤ 1.3×",
            ("mcp_stdio", "direct_mcp_stdio"): "T1: ≤ 1.3×"}  # fmt: skip
    header = ("call", "p50 ms", "p99 ms", "beside", "its p50 ms", "p50 ratio")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)), flush=True)
    met = all(figures[f"{n}_vs_direct_p50"] <= 1.3 for n in ("http_tool", "mcp_http", "mcp_stdio"))
    print(f"goal: HTTP and MCP tools ≤ 1.3× the direct call, p50: {'met' if met else 'not met'}", flush=True)
    if args.json:
        flat = {f"{k}_{m}": v[m] for k, v in figures.items() if isinstance(v, dict) for m in v}
        flat.update({k: v for k, v in figures.items() if not isinstance(v, dict)})
        table = [
            (f"{r[0]} p50 (p99) ms", f"{r[1]} ({r[2]})", f"{r[3]} {r[4]}", r[5], goal.get((r[0], r[3]), ""))
            for r in rows
        ]
        print(json.dumps({"bench": "tools", "rows": table, "notes": [], "figures": flat}))


if __name__ == "__main__":
    main()
