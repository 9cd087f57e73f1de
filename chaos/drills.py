"""Fault drills: the scaled mode for real, broken on purpose, then checked for invariants.

For each drill this starts an ASGI server (`manage.py serve`) and two `rundramatiq` workers against a
fresh PostgreSQL database and a Redis database of their own, starts N incident-fanout runs through the
API (e-mails in propose mode, so each run waits for one bundled approval, granted through the API by a
scripted reviewer), and breaks something while they run:

  worker-sigkill         SIGKILL a random worker at random moments; a new one starts at once
  redis-down             `redis-cli shutdown nosave`, Redis back after --redis-down seconds
  postgres-restart       PostgreSQL restarted with `-m immediate` (twice)
  duplicates-and-freeze  every message delivered twice, and a worker frozen (SIGSTOP) past its lease
  timeouts-after-commit  tools that time out after they committed: half the runs on a system with a
                         status lookup (reconciled), half on one whose lookup is down (a person decides)

Then it waits for the runs to settle and checks what must hold whatever broke:

  converged     every run completed, failed, cancelled or compensated, or needs attention with a reason
  duplicates    idempotency keys with more than one effect in any sandbox system (must be 0)
  orphans       effects in a sandbox system with no intent row in the ledger (must be 0)
  lost          decisions the reviewer was told were recorded but are not, approved operations of a
                finished run never executed, runs still waiting for a decision (must be 0)
  unreconciled  ambiguous operations in a run that does not need attention (must be 0)

and prints one row per drill, with the time from the end of the fault to the last run settling.

    .venv/bin/python chaos/drills.py [--runs 50] [--drill NAME ...] [--redis-down 20] [--json]

Everything goes to 127.0.0.1. It needs PostgreSQL and Redis on this machine and the rights to restart
them (the commands of .ci/run); it creates and drops its own databases (warden_chaos_*) and uses Redis
database 9 (--redis-db). Run nothing else against this PostgreSQL or Redis meanwhile: both are
restarted. docs/operations.md has the figures and what each failure does.
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PG = "postgres://postgres@127.0.0.1:5432"
TEMPLATE = "warden_chaos_template"
REDIS_START = [
    "redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379", "--save", "",
    "--appendonly", "no", "--dir", "/var/lib/redis", "--logfile", "/var/log/redis/ci.log",
]  # fmt: skip
# Short timings, so that a lost lease or message is noticed in seconds (production uses the defaults).
TIMINGS = {
    "WARDEN_LEASE_SECONDS": "4",
    "WARDEN_HEARTBEAT_SECONDS": "1",
    "WARDEN_SWEEP_INTERVAL_SECONDS": "0.5",
    "WARDEN_REDRIVE_AFTER_SECONDS": "2",
    "WARDEN_OUTBOX_RESEND_AFTER_SECONDS": "2",
    "WARDEN_RETRY_BASE_SECONDS": "0.1",
    "WARDEN_RETRY_CAP_SECONDS": "1",
}
SECRET = "chaos-" + os.urandom(24).hex()
SETTLED = {"completed", "failed", "cancelled", "compensated", "needs_attention"}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the services ---------------------------------------------------------------------------------------


def pg_version() -> str:
    return sorted(os.listdir("/etc/postgresql"))[-1]


def pg_ready() -> bool:
    return subprocess.run(["pg_isready", "-h", "127.0.0.1", "-p", "5432", "-q"]).returncode == 0


def redis_ready() -> bool:
    result = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", "6379", "ping"], capture_output=True, text=True)
    return result.stdout.strip() == "PONG"


def wait_until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


def postgres_restart() -> None:
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", "-m", "immediate", pg_version(), "main", "restart"],
        check=True,
        capture_output=True,
    )
    wait_until(pg_ready, 60, "PostgreSQL")


def redis_stop() -> None:
    subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", "6379", "shutdown", "nosave"], capture_output=True)
    wait_until(lambda: not redis_ready(), 10, "Redis to stop")


def redis_start() -> None:
    if not redis_ready():
        subprocess.run(REDIS_START, check=True, capture_output=True)
    wait_until(redis_ready, 30, "Redis")


def psql(sql: str, database: str = "postgres") -> None:
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", database, "-q", "-v", "ON_ERROR_STOP=1", "-c", sql],
        check=True,
        capture_output=True,
    )


def db_drop(name: str) -> None:
    psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- the processes ----------------------------------------------------------------------------------------


@dataclass
class Cluster:
    """The ASGI server and the workers of one drill; the runner acts as their process manager."""

    database: str
    redis_url: str
    log_dir: Path
    extra_env: dict = field(default_factory=dict)
    port: int = 0
    server: subprocess.Popen | None = None
    workers: list = field(default_factory=list)
    started: int = 0

    def env(self) -> dict:
        env = dict(os.environ, DJANGO_SETTINGS_MODULE="config.settings.base", PYTHONUNBUFFERED="1")
        env.update(TIMINGS)
        env.update(
            DATABASE_URL=f"{PG}/{self.database}",
            REDIS_URL=self.redis_url,
            WARDEN_QUEUE_NAMESPACE=f"warden-chaos-{os.getpid()}",
            WARDEN_VAR_DIR=str(self.log_dir / "var"),
            DJANGO_SECRET_KEY=SECRET,  # one key for every process of the drill (none races to create it)
        )
        env.update(self.extra_env)
        return env

    def _spawn(self, args: list[str], name: str) -> subprocess.Popen:
        self.started += 1
        out = open(self.log_dir / f"{name}-{self.started}.log", "w")
        return subprocess.Popen(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a SIGKILL takes the worker's children too
        )

    def start(self, workers: int = 2) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = self._spawn(["serve", "--port", str(self.port)], "server")
        for _ in range(workers):
            self.worker_start()
        wait_until(self._serving, 60, "the server")

    def _serving(self) -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/login/", timeout=2).close()
            return True
        except (urllib.error.URLError, OSError):
            return False

    def worker_start(self) -> None:
        self.workers.append(self._spawn(["rundramatiq", "--processes", "1", "--threads", "3"], "worker"))

    def signal_worker(self, index: int, sig: int) -> None:
        try:
            os.killpg(self.workers[index].pid, sig)
        except ProcessLookupError:
            pass

    def kill_random_worker(self) -> int:
        index = random.randrange(len(self.workers))
        self.signal_worker(index, signal.SIGKILL)
        self.workers[index].wait(timeout=30)
        self.workers.pop(index)
        self.worker_start()  # restarted at once, as a process manager would
        return index

    def supervise(self) -> None:
        """A worker that died by itself (a lost database or Redis) is restarted, as systemd would."""
        for index, proc in enumerate(list(self.workers)):
            if proc.poll() is not None:
                log(f"worker {proc.pid} exited ({proc.returncode}); restarting it")
                self.workers[index] = self._spawn(["rundramatiq", "--processes", "1", "--threads", "3"], "worker")
        if self.server is not None and self.server.poll() is not None:
            log(f"server exited ({self.server.returncode}); restarting it")
            self.server = self._spawn(["serve", "--port", str(self.port)], "server")

    def stop(self) -> None:
        for proc in [self.server, *self.workers]:
            if proc is None or proc.poll() is not None:
                continue
            try:
                os.killpg(proc.pid, signal.SIGCONT)
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)


# --- the API, as an outside system uses it ------------------------------------------------------------------


class Api:
    def __init__(self, port: int, token: str):
        self.base, self.token = f"http://127.0.0.1:{port}/api/v1", token

    def call(self, method: str, path: str, body: dict | None = None, key: str = "") -> tuple[int, dict]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Content-Type", "application/json")
        if key:
            request.add_header("Idempotency-Key", key)
        try:
            with urllib.request.urlopen(request, timeout=15) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                return exc.code, json.loads(exc.read() or b"{}")
            except ValueError:
                return exc.code, {}
        except (urllib.error.URLError, OSError, ValueError):
            return 0, {}  # the server (or what it needs) is down: the caller tries again

    def run_start(self, body: dict, key: str, give_up: float) -> int:
        """The same Idempotency-Key on every try: a run is started once, however often the call is repeated."""
        while time.monotonic() < give_up:
            status, answer = self.call("POST", "/runs", body, key=key)
            if status == 201:
                return answer["id"]
            time.sleep(0.5)
        raise RuntimeError(f"could not start a run ({key})")


class Reviewer(threading.Thread):
    """Approves every pending request of the drill's runs through the API; remembers each decision the
    API said it recorded, so that none can be lost unnoticed."""

    def __init__(self, api: Api):
        super().__init__(daemon=True)
        self.api, self.stop = api, threading.Event()
        self.recorded: dict[int, str] = {}  # request id -> its arguments hash

    def run(self) -> None:
        while not self.stop.is_set():
            status, pending = self.api.call("GET", "/approvals?status=pending")
            for request in pending if status == 200 and isinstance(pending, list) else []:
                if request["parent"] is not None or request["id"] in self.recorded:
                    continue
                body = {"decision": "approve", "arguments_hash": request["arguments_hash"], "note": "chaos drill"}
                code, _ = self.api.call("POST", f"/approvals/{request['id']}/decision", body)
                if code == 200:
                    self.recorded[request["id"]] = request["arguments_hash"]
            self.stop.wait(0.3)


# --- the database, read by the runner ----------------------------------------------------------------------


def django_setup(database: str) -> None:
    os.environ.update(
        DJANGO_SETTINGS_MODULE="config.settings.base",
        DATABASE_URL=f"{PG}/{database}",
        WARDEN_VAR_DIR=os.environ.get("WARDEN_VAR_DIR", tempfile.mkdtemp(prefix="warden-chaos-")),
    )
    import django

    django.setup()


def use_database(name: str) -> None:
    from django.db import connections

    connections.close_all()
    connections["default"].settings_dict["NAME"] = name


def read(fn, *args):
    """A read that outlives a PostgreSQL restart: on a broken connection, reconnect and read again."""
    from django.db import InterfaceError, OperationalError, connections

    for _ in range(60):
        try:
            return fn(*args)
        except (OperationalError, InterfaceError):
            connections.close_all()
            time.sleep(0.5)
    return fn(*args)


def template_create() -> dict:
    """Migrated, with the demo workflows, an operator who starts runs and a reviewer who decides."""
    db_drop(TEMPLATE)
    psql(f'CREATE DATABASE "{TEMPLATE}"')
    env = dict(os.environ, DATABASE_URL=f"{PG}/{TEMPLATE}", DJANGO_SETTINGS_MODULE="config.settings.base")
    env.pop("REDIS_URL", None)
    subprocess.run([sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"], cwd=ROOT, env=env, check=True)
    use_database(TEMPLATE)
    from django.contrib.auth import get_user_model

    from agents.demo import load_demo_workflows
    from approvals.policies import demo_waivers_load
    from tenancy.access import default_project, membership_grant
    from tenancy.tokens import api_token_create

    load_demo_workflows()
    demo_waivers_load()
    users = get_user_model().objects
    operator = users.create_user(username="chaos-operator", password="chaos-operator-pass-1")
    reviewer = users.create_user(username="chaos-reviewer", password="chaos-reviewer-pass-1")
    membership_grant(user=operator, project=default_project(), role="operator")
    membership_grant(user=reviewer, project=default_project(), role="reviewer")
    _, start_token = api_token_create(user=operator, scopes=["run", "read", "operate"])
    _, review_token = api_token_create(user=reviewer, scopes=["approve", "read"])
    from django.db import connections

    connections.close_all()
    return {"operator": start_token, "reviewer": review_token}


def settled(run_ids: list[int]) -> bool:
    from runs.models import Run, Task

    statuses = set(Run.objects.filter(id__in=run_ids).values_list("status", flat=True))
    busy = Task.objects.filter(run_id__in=run_ids, status=Task.Status.RUNNING).exists()
    return statuses <= SETTLED and not busy


def unsettled(run_ids: list[int]) -> list[str]:
    """What each run that did not settle is doing: the diagnosis printed with a failed drill."""
    from policy.models import ApprovalRequest
    from runs.models import Run, Task
    from tools.models import ToolOperation

    lines = []
    for run in Run.objects.filter(id__in=run_ids).order_by("id"):
        tasks = list(Task.objects.filter(run=run).order_by("key"))
        if run.status in SETTLED and not any(t.status == Task.Status.RUNNING for t in tasks):
            continue
        lines.append(
            f"run {run.id}: {run.status} ({run.status_reason[:120]}) ops lease {run.ops_lease_owner or '-'} "
            f"until {run.ops_lease_expires_at}"
        )
        for t in tasks:
            lines.append(
                f"  task {t.key}: {t.status} attempts {t.attempts} recoveries {t.recoveries} "
                f"lease {t.lease_owner or '-'} until {t.lease_expires_at} "
                f"ready_at {t.ready_at} not_before {t.not_before} token {t.fencing_token}"
            )
        for op in ToolOperation.objects.filter(run=run).order_by("id"):
            lines.append(f"  op {op.id} {op.kind} {op.tool} {op.idempotency_key}: {op.status}")
        for request in ApprovalRequest.objects.filter(run=run, parent__isnull=True):
            lines.append(f"  approval {request.id} {request.kind}: {request.status}")
    return lines


def invariants(run_ids: list[int], reviewer: Reviewer) -> dict:
    from django.db.models import Count, Q

    from policy.models import ApprovalRequest, Decision
    from runs.models import Run
    from tools.installation import run_key_prefix
    from tools.models import SandboxCall, ToolOperation

    runs = list(Run.objects.filter(id__in=run_ids).values("id", "status", "status_reason"))
    keys = Q()
    for run_id in run_ids:
        keys |= Q(idempotency_key__startswith=run_key_prefix(run_id))
    effects = SandboxCall.objects.filter(keys, is_effect=True)
    duplicates = effects.values("system", "idempotency_key").annotate(n=Count("id")).filter(n__gt=1).count()
    intents = set(ToolOperation.objects.filter(run_id__in=run_ids).values_list("idempotency_key", flat=True))
    orphans = sum(1 for key in effects.values_list("idempotency_key", flat=True) if key not in intents)
    # A bundle's approval is recorded on each of its items.
    approvals = Decision.objects.filter(verdict="approve")
    items = ApprovalRequest.objects.filter(parent_id__in=list(reviewer.recorded))
    undecided_items = items.exclude(id__in=approvals.values("request_id")).values_list("parent_id", flat=True)
    decided = set(approvals.filter(request_id__in=list(reviewer.recorded)).values_list("request_id", flat=True))
    decided |= set(items.values_list("parent_id", flat=True)) - set(undecided_items)
    finished = [r["id"] for r in runs if r["status"] == "completed"]
    lost = (
        len(set(reviewer.recorded) - decided)
        + ToolOperation.objects.filter(run_id__in=finished, status__in=["approved", "awaiting_approval"]).count()
        + ApprovalRequest.objects.filter(run_id__in=run_ids, status="pending", run__status="completed").count()
    )
    attention = {r["id"] for r in runs if r["status"] == "needs_attention"}
    unreconciled = ToolOperation.objects.filter(run_id__in=run_ids, status="ambiguous").exclude(run_id__in=attention)
    converged = [r for r in runs if r["status"] in SETTLED and (r["status"] != "needs_attention" or r["status_reason"])]
    return {
        "converged": len(converged),
        "completed": len(finished),
        "needs_attention": len(attention),
        "duplicates": duplicates,
        "orphans": orphans,
        "lost": lost,
        "unreconciled": unreconciled.count(),
        "effects": effects.count(),
        "reasons": sorted({r["status_reason"][:200] for r in runs if r["status"] == "needs_attention"}),
    }


# --- the drills ---------------------------------------------------------------------------------------------


def run_inputs(drill: str, n: int) -> list[dict]:
    base = {"propose_tools": ["email.send"]}
    if drill != "timeouts-after-commit":
        return [base] * n
    # Half on systems that can be asked (ticket created, answer lost: reconciled by key), half on one
    # whose status lookup is down (a person must say whether the record changed).
    return [
        {**base, "faults": [{"task": "worker-2", "call": 2, "mode": "timeout_after_commit"}]}
        if i % 2 == 0
        else {**base, "faults": [{"task": "worker-4", "call": 3, "mode": "timeout_no_lookup"}]}
        for i in range(n)
    ]


def inject(drill: str, cluster: Cluster, started: float, args, done) -> None:
    """Break things while the runs go; returns when the fault is over."""
    if drill == "worker-sigkill":
        kills = max(3, args.runs // 4)
        for _ in range(kills):
            time.sleep(random.uniform(0.3, 2.5))
            if done():
                break
            index = cluster.kill_random_worker()
            log(f"  SIGKILL worker #{index}; a new one started")
    elif drill == "redis-down":
        time.sleep(1.5)
        redis_stop()
        log(f"  Redis down for {args.redis_down}s")
        time.sleep(args.redis_down)
        redis_start()
        log("  Redis back")
    elif drill == "postgres-restart":
        for _ in range(2):
            time.sleep(random.uniform(1.0, 3.0))
            postgres_restart()
            log("  PostgreSQL restarted (-m immediate)")
    elif drill == "duplicates-and-freeze":
        time.sleep(1.5)
        index = random.randrange(len(cluster.workers))
        frozen = float(TIMINGS["WARDEN_LEASE_SECONDS"]) * 2 + 2
        cluster.signal_worker(index, signal.SIGSTOP)
        log(f"  worker #{index} frozen (SIGSTOP) for {frozen:.0f}s, past its lease")
        time.sleep(frozen)
        cluster.signal_worker(index, signal.SIGCONT)
        log(f"  worker #{index} resumed (SIGCONT)")


def drill_run(drill: str, tokens: dict, args, log_root: Path) -> dict:
    database = f"warden_chaos_{drill.replace('-', '_')}"
    db_drop(database)
    psql(f'CREATE DATABASE "{database}" TEMPLATE "{TEMPLATE}"')
    redis_url = f"redis://127.0.0.1:6379/{args.redis_db}"
    subprocess.run(["redis-cli", "-n", str(args.redis_db), "flushdb"], capture_output=True)
    log_dir = log_root / drill
    log_dir.mkdir(parents=True, exist_ok=True)
    extra = {"WARDEN_CHAOS_DUPLICATE_DELIVERY": "1"} if drill == "duplicates-and-freeze" else {}
    cluster = Cluster(database=database, redis_url=redis_url, log_dir=log_dir, extra_env=extra)
    use_database(database)
    started = time.monotonic()
    run_ids: list[int] = []
    reviewer = None
    try:
        cluster.start(workers=2)
        operator = Api(cluster.port, tokens["operator"])
        reviewer = Reviewer(Api(cluster.port, tokens["reviewer"]))
        reviewer.start()
        for i, run_input in enumerate(run_inputs(drill, args.runs)):
            body = {"workflow": "incident-fanout", "input": run_input}
            run_ids.append(operator.run_start(body, key=f"chaos-{drill}-{os.getpid()}-{i}", give_up=started + 120))
        log(f"{drill}: {len(run_ids)} runs started")

        stop_supervising = threading.Event()

        def supervise():
            while not stop_supervising.wait(1.0):
                cluster.supervise()

        supervisor = threading.Thread(target=supervise, daemon=True)
        supervisor.start()
        inject(drill, cluster, started, args, done=lambda: read(settled, run_ids))
        fault_over = time.monotonic()
        deadline = fault_over + args.settle_timeout
        while time.monotonic() < deadline and not read(settled, run_ids):
            time.sleep(0.5)
        converge, wall = time.monotonic() - fault_over, time.monotonic() - started
        for line in read(unsettled, run_ids):
            log(line)
        stop_supervising.set()
        reviewer.stop.set()
        reviewer.join(timeout=5)
        figures = read(invariants, run_ids, reviewer)
    finally:
        if reviewer is not None:
            reviewer.stop.set()
        cluster.stop()
        if not redis_ready():
            redis_start()
    row = {"drill": drill, "runs": len(run_ids), **figures, "converge_s": round(converge, 1), "wall_s": round(wall)}
    row["ok"] = (
        row["converged"] == row["runs"]
        and not row["duplicates"]
        and not row["orphans"]
        and not row["lost"]
        and not row["unreconciled"]
    )
    if not args.keep:
        from django.db import connections

        connections.close_all()
        db_drop(database)
    return row


DRILLS = ["worker-sigkill", "redis-down", "postgres-restart", "duplicates-and-freeze", "timeouts-after-commit"]


def table(rows: list[dict]) -> str:
    columns = [
        ("drill", "drill"), ("runs", "runs"), ("converged", "converged"), ("completed", "completed"),
        ("needs_attention", "needs attention"), ("duplicates", "duplicates"), ("orphans", "orphan effects"),
        ("lost", "lost decisions"), ("unreconciled", "unreconciled"), ("converge_s", "settled after the fault (s)"),
        ("wall_s", "drill (s)"),
    ]  # fmt: skip
    widths = [max(len(title), *(len(str(r[key])) for r in rows)) for key, title in columns]
    lines = [" | ".join(title.ljust(w) for (_, title), w in zip(columns, widths, strict=True))]
    lines.append("-|-".join("-" * w for w in widths))
    for r in rows:
        lines.append(" | ".join(str(r[key]).ljust(w) for (key, _), w in zip(columns, widths, strict=True)))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="incident-fanout runs per drill")
    parser.add_argument("--drill", action="append", choices=DRILLS, help="only these drills (default: all)")
    parser.add_argument("--redis-down", type=float, default=20, help="seconds Redis stays down (10-30)")
    parser.add_argument("--redis-db", type=int, default=9)
    parser.add_argument("--settle-timeout", type=float, default=240, help="seconds to wait for the runs")
    parser.add_argument("--keep", action="store_true", help="keep the drills' databases")
    parser.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    args = parser.parse_args()
    if not (pg_ready() and redis_ready()):
        print("PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379) must be running", file=sys.stderr)
        return 2
    django_setup(TEMPLATE)
    log_root = Path(tempfile.mkdtemp(prefix="warden-chaos-logs-"))
    log(f"logs in {log_root}")
    tokens = template_create()
    rows = []
    try:
        for drill in args.drill or DRILLS:
            log(f"{drill}: starting")
            rows.append(drill_run(drill, tokens, args, log_root))
            log(f"{drill}: {'ok' if rows[-1]['ok'] else 'FAILED'} {rows[-1]}")
    finally:
        if not redis_ready():
            redis_start()
        from django.db import connections

        connections.close_all()
        db_drop(TEMPLATE)
    print(table(rows))
    if args.json:
        print(json.dumps(rows))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
