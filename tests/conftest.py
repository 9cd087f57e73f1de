"""Fixtures shared by all tests: people, the demo workflows, an in-process worker, real processes."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dramatiq
import pytest
from django.conf import settings
from django.db import connection

from agents.demo import load_demo_workflows
from approvals.policies import demo_waivers_load
from runs.services.outbox import forgetter
from tools.mcp_sessions import mcp_sessions_close

ROOT = Path(__file__).resolve().parent.parent
SQLITE = settings.DATABASES["default"]["ENGINE"].endswith("sqlite3")
SCALED = bool(settings.REDIS_URL) and not SQLITE


def _postgresql_flush_by_delete():
    """A transactional test ends with Django's flush, which on PostgreSQL is one TRUNCATE of all ~60
    tables: PostgreSQL swaps every table's and index's files for new ones, 0.3 s on an idle machine
    and 1-2 s under CI's load, after each of the ~300 transactional tests of the scaled half. This
    empties the same tables with DELETE, only those that hold a row (a few ms): the database ends
    exactly as empty as TRUNCATE leaves it (sequences are not reset by either; post_migrate still runs
    afterwards). Foreign keys are DEFERRABLE INITIALLY DEFERRED, so the order of the DELETEs does not
    matter (flush runs them in one transaction); a table with a trigger of its own (the append-only
    audit log refuses DELETE) is still truncated. Only for the flush of a test's teardown (no CASCADE,
    no sequence reset); anything else goes to Django's TRUNCATE."""
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if not tables or reset_sequences or allow_cascade:
            return truncate(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        qn = self.quote_name
        with self.connection.cursor() as cursor:
            cursor.execute(
                " UNION ALL ".join(f"SELECT %s WHERE EXISTS (SELECT 1 FROM {qn(table)})" for table in tables),
                list(tables),
            )
            filled = [row[0] for row in cursor.fetchall()]
            if not filled:
                return []
            cursor.execute(
                "SELECT DISTINCT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
                " WHERE NOT t.tgisinternal AND c.relname = ANY(%s)",
                [filled],
            )
            triggered = {row[0] for row in cursor.fetchall()}
        return [
            "SET CONSTRAINTS ALL DEFERRED;",
            *truncate(self, style, sorted(triggered)),
            *(f"DELETE FROM {qn(table)};" for table in filled if table not in triggered),
        ]

    DatabaseOperations.sql_flush = sql_flush


if not SQLITE:
    _postgresql_flush_by_delete()

# Rows that migrations write and no test changes: content types and permissions.
KEPT_TABLES = ("django_content_type", "auth_permission")


def _teardown_flush_keeps_content_types():
    """Django's flush after a transactional test empties every table, content types and permissions too,
    then runs post_migrate to write all ~70 content types and ~280 permissions again: 0.2-0.8 s per test
    under CI's load, on SQLite as on PostgreSQL, for rows no test changes. This teardown empties every
    other table the same way (the same sql_flush, so PostgreSQL's DELETE above still applies) and keeps
    those rows, as an ordinary (rolled back) test finds them. If a test did change them (their count or
    highest id differs from what the last flush left), Django's own flush and post_migrate run instead."""
    from django.core.management import call_command
    from django.core.management.color import no_style
    from django.db import connections
    from django.test import TransactionTestCase

    django_teardown = TransactionTestCase._fixture_teardown
    known: dict[str, tuple] = {}  # alias → the kept tables' fingerprint after the last flush

    def fingerprint(conn) -> tuple:
        with conn.cursor() as cursor:
            cursor.execute(
                "SELECT (SELECT COUNT(*) FROM django_content_type), (SELECT MAX(id) FROM django_content_type),"
                " (SELECT COUNT(*) FROM auth_permission), (SELECT MAX(id) FROM auth_permission)"
            )
            return tuple(cursor.fetchone())

    def _fixture_teardown(self):
        if self.available_apps is not None or self.serialized_rollback:
            return django_teardown(self)
        for alias in self._databases_names(include_mirrors=False):
            conn = connections[alias]
            if known.get(alias) != fingerprint(conn):
                call_command("flush", verbosity=0, interactive=False, database=alias, reset_sequences=False)
                known[alias] = fingerprint(conn)
                continue
            tables = conn.introspection.django_table_names(only_existing=True, include_views=False)
            sql = conn.ops.sql_flush(no_style(), [t for t in tables if t not in KEPT_TABLES])
            if sql:
                conn.ops.execute_sql_flush(sql)

    TransactionTestCase._fixture_teardown = _fixture_teardown


_teardown_flush_keeps_content_types()


def pytest_collection_modifyitems(config, items):
    # Fault drills restart PostgreSQL and Redis: nothing may run after them but themselves.
    items.sort(key=lambda item: "chaos" in item.keywords)
    require = os.environ.get("WARDEN_REQUIRE_SERVICES") == "1"
    for item in items:
        if "services" in item.keywords and not SCALED:
            if require:
                raise pytest.UsageError(
                    "WARDEN_REQUIRE_SERVICES=1 but DATABASE_URL/REDIS_URL do not point at PostgreSQL + Redis"
                )
            item.add_marker(
                pytest.mark.skip(reason="scaled mode only: run with DATABASE_URL=postgres://… REDIS_URL=redis://…")
            )
        if "browser" in item.keywords and not Path("/usr/bin/chromium").exists():
            if require:
                raise pytest.UsageError(
                    "WARDEN_REQUIRE_SERVICES=1 but /usr/bin/chromium is missing (apt-get install chromium)"
                )
            item.add_marker(
                pytest.mark.skip(reason="browser tests need Debian's chromium: apt-get install -y chromium")
            )
        if "embedded" in item.keywords and not (SQLITE and not settings.REDIS_URL):
            item.add_marker(pytest.mark.skip(reason="embedded mode only (SQLite, in-memory broker)"))
        if "anymode" in item.keywords and SCALED:
            # Reads the source or builds a package: the same in both modes, so ./warden test's embedded
            # half (which always runs) runs it once.
            item.add_marker(pytest.mark.skip(reason="mode-independent: run in the embedded half"))


def pytest_sessionfinish(session, exitstatus):
    import shutil

    if os.environ.get("PROMETHEUS_MULTIPROC_DIR", "").startswith(str(settings.VAR_DIR)):  # this session's
        shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)
    if settings.REDIS_URL:
        import redis

        client = redis.Redis.from_url(settings.REDIS_URL)
        namespace = os.environ["WARDEN_QUEUE_NAMESPACE"]
        for key in client.scan_iter(f"{namespace}*"):
            client.delete(key)


# Debian's Chromium, as the brief says to launch it (browser tests: Playwright drives it).
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def live_url(transactional_db):
    """A WSGI server for one test (pages only: no websocket), stopped when the test ends."""
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.test.testcases import LiveServerThread

    thread = LiveServerThread("127.0.0.1", StaticFilesHandler)
    thread.daemon = True
    thread.start()
    thread.is_ready.wait()
    if thread.error:
        raise thread.error
    yield f"http://127.0.0.1:{thread.port}"
    thread.terminate()


def wait_for(predicate, *, timeout: float = 30, interval: float = 0.05, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


@pytest.fixture
def operator(django_user_model):
    """A member of the default project who may do everything there (admin role)."""
    from tenancy.access import default_project, membership_grant

    user = django_user_model.objects.create_user(username="olivia", password="operator-pass-123")
    membership_grant(user=user, project=default_project(), role="admin")
    return user


@pytest.fixture
def demo(db):
    load_demo_workflows()
    demo_waivers_load()


@pytest.fixture
def demo_tx(transactional_db):
    load_demo_workflows()
    demo_waivers_load()


@pytest.fixture
def worker(transactional_db, request):
    """Dramatiq worker threads and the recovery sweeper in this process, as the embedded server runs them:
    4 threads, or the test module's WORKER_THREADS."""
    import runs.actors  # noqa: F401
    from runs.services.recovery import sweeper

    broker = dramatiq.get_broker()
    if hasattr(broker, "flush_all"):
        broker.flush_all()
    threads = getattr(request.module, "WORKER_THREADS", 4)
    w = dramatiq.Worker(broker, worker_threads=threads, worker_timeout=50)
    w.start()
    yield w
    w.stop()
    sweeper.stop()
    broker.middleware[:] = [m for m in broker.middleware if getattr(m, "worker", None) is not w]
    if hasattr(broker, "flush_all"):
        broker.flush_all()


def process_env(**extra) -> dict:
    """Environment for a worker or server process that must use this test session's database and queues."""
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="config.settings.test", PYTHONUNBUFFERED="1")
    db = connection.settings_dict
    if SQLITE:
        env.pop("DATABASE_URL", None)
        env["WARDEN_SQLITE_PATH"] = str(db["NAME"])
    else:
        user = db.get("USER") or "postgres"
        env["DATABASE_URL"] = f"postgres://{user}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Processes:
    """Starts real worker and server processes and makes sure none outlives the test."""

    def __init__(self, tmp_path):
        self.started: list[subprocess.Popen] = []
        self.tmp_path = tmp_path

    def _start(self, args, env, name):
        log = open(self.tmp_path / f"{name}-{len(self.started)}.log", "w")
        proc = subprocess.Popen(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        proc.log_path = log.name
        self.started.append(proc)
        return proc

    def worker(self, *, threads: int = 2, **env):
        return self._start(["rundramatiq", "--processes", "1", "--threads", str(threads)], process_env(**env), "worker")

    def server(self, *, port: int, threads: int = 2, **env):
        return self._start(["serve", "--port", str(port), "--threads", str(threads)], process_env(**env), "server")

    def runner(self, *, threads: int = 2, **env):
        """The process that runs attempts in this session's mode: a ``rundramatiq`` worker (scaled), or the
        embedded server, whose worker threads take the runs this process starts once its sweeper
        re-drives them (their messages went to this process's in-memory broker)."""
        if SCALED:
            return self.worker(threads=threads, **env)
        return self.server(port=free_port(), threads=threads, **env)

    def children(self, proc) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout
        return [int(pid) for pid in out.split()]

    def log(self, proc) -> str:
        return Path(proc.log_path).read_text()

    def stop_all(self):
        for proc in self.started:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGCONT)
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)


@pytest.fixture
def processes(tmp_path):
    procs = Processes(tmp_path)
    yield procs
    procs.stop_all()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session", autouse=True)
def events_publisher_stopped(django_db_setup, django_db_blocker):
    """The live-update publisher's and the outbox's threads hold database connections: they end before the
    test database is dropped (PostgreSQL refuses to drop a database in use)."""
    yield
    from dashboard.live import publisher

    publisher.stop()
    forgetter.stop()


@pytest.fixture(autouse=True)
def closed_circuits():
    """Tool circuit breakers live in the cache, which outlives a test: every test starts with them closed."""
    from agents.gateway import circuit_reset as model_circuit_reset
    from tools.broker import circuit_reset

    circuit_reset()
    model_circuit_reset()


@pytest.fixture(autouse=True)
def mcp_sessions_closed():
    """MCP sessions live as long as their process: a test's stdio servers stop when it ends."""
    yield
    mcp_sessions_close()


class WebhookReceiver:
    """A local HTTP receiver: records every request; answers 500 to the first ``fail_first`` ones, and
    keeps the first ``hold_first`` ones waiting until ``release`` is set (a sender caught mid-post)."""

    def __init__(self):
        import http.server
        import threading

        self.received: list[dict] = []
        self.fail_first = 0
        self.hold_first = 0
        self.release = threading.Event()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.received.append({"headers": dict(self.headers), "body": body})
                if len(receiver.received) <= receiver.hold_first:
                    receiver.release.wait(timeout=60)
                failing = len(receiver.received) <= receiver.fail_first
                try:
                    self.send_response(500 if failing else 200)
                    self.end_headers()
                except OSError:
                    pass  # the sender is gone

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def events(self) -> list[str]:
        """Event names in delivery-id order: deliveries are separate messages, so arrival order is not
        guaranteed, the id (assigned when the event was decided) is."""
        ordered = sorted(self.received, key=lambda r: int(r["headers"].get("Warden-Delivery", 0)))
        return [r["headers"].get("Warden-Event") for r in ordered]

    def delivery_ids(self) -> list[int]:
        return [int(r["headers"]["Warden-Delivery"]) for r in self.received]

    def stop(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook_receiver():
    receiver = WebhookReceiver()
    yield receiver
    receiver.stop()


def decide(*, request_id: int, **kwargs):
    """A decision through the service, by a reviewer who saw the request as it now stands (its current
    arguments hash), as the queue, the API and the admin send it."""
    from approvals.services import approval_decide
    from policy.models import ApprovalRequest

    seen = ApprovalRequest.objects.filter(id=request_id).values_list("arguments_hash", flat=True).first() or ""
    return approval_decide(request_id=request_id, seen_hash=seen, **kwargs)
