"""Operating Warden itself (docs/operations.md): the probes a load balancer calls, what Prometheus scrapes,
the workers an operator sees, and the doctor's verdict, each checked from outside as they would be."""

import json
import re
import socket
import subprocess
import threading
import urllib.request

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection

from dashboard import ops
from runs.models import Run, WorkerProcess
from runs.services import run_start
from tests.conftest import SCALED, SQLITE, free_port, wait_for


class TcpProxy:
    """A throwaway TCP proxy in front of a real service, to take the service "away" from one client and
    bring it back without touching the service itself (others use it)."""

    def __init__(self, target_port: int):
        self.target, self.port = ("127.0.0.1", target_port), free_port()
        self.sockets: list[socket.socket] = []
        self.listener = None

    def open(self):
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def _accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        """Every connection through it is cut and no new one is accepted."""
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread, which lets the port go
        except OSError:
            pass
        self.listener.close()
        for s in self.sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass
        self.sockets = []


def _ready(client) -> tuple[int, dict]:
    response = client.get("/readyz")
    return response.status_code, response.json()["checks"]


# --- probes ---------------------------------------------------------------------------------------------
def test_healthz_and_readyz_answer_anyone_with_ok_per_dependency_only(transactional_db, client):
    assert client.get("/healthz").json() == {"status": "ok"}
    status, checks = _ready(client)
    expected = {"database", "redis", "channel_layer"} if settings.REDIS_URL else {"database", "channel_layer"}
    assert status == 200 and checks == dict.fromkeys(expected, "ok")


@pytest.mark.embedded
def test_readyz_is_not_ready_while_the_database_lacks_its_migrations(transactional_db, client, tmp_path, monkeypatch):
    monkeypatch.setattr(ops, "_migrated", False)
    monkeypatch.setitem(connection.settings_dict, "NAME", str(tmp_path / "fresh.sqlite3"))
    connection.close()
    try:
        status, checks = _ready(client)
        assert status == 503 and checks["database"] == "migrations pending"
    finally:
        connection.close()
    monkeypatch.undo()
    assert _ready(client)[0] == 200


@pytest.mark.services
def test_readyz_follows_postgresql_and_redis_going_away_and_coming_back(transactional_db, client, tmp_path, settings):
    """PostgreSQL behind a proxy this test cuts and opens again; Redis is a private redis-server on a free
    port, stopped and started again. The machine's own services are never touched."""
    proxy = TcpProxy(int(connection.settings_dict.get("PORT") or 5432))
    proxy.open()
    port = free_port()
    redis_args = ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(tmp_path)]
    private = subprocess.Popen(redis_args, stdout=subprocess.DEVNULL)
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [settings.REDIS_URL]}}
    }
    port_before = connection.settings_dict["PORT"]
    connection.settings_dict["PORT"] = proxy.port
    connection.close()
    try:
        wait_for(lambda: _ready(client)[0] == 200, timeout=10, message="ready through the proxy and private Redis")

        proxy.close()
        status, checks = _ready(client)
        assert status == 503 and checks["database"] == "unreachable" and checks["redis"] == "ok"
        scraped = client.get("/metrics")  # the processes' counters still go out, and say the database is away
        assert scraped.status_code == 200 and "warden_database_figures 0.0" in scraped.content.decode()
        proxy.open()
        wait_for(lambda: _ready(client)[0] == 200, timeout=10, message="ready again with PostgreSQL back")

        private.terminate()
        private.wait(timeout=10)
        status, checks = _ready(client)
        assert status == 503 and checks["redis"] == "unreachable" and checks["database"] == "ok"
        private = subprocess.Popen(redis_args, stdout=subprocess.DEVNULL)
        wait_for(lambda: _ready(client)[0] == 200, timeout=10, message="ready again with Redis back")
    finally:
        private.kill()
        private.wait(timeout=10)
        connection.close()
        connection.settings_dict["PORT"] = port_before
        proxy.close()


# --- metrics --------------------------------------------------------------------------------------------
def test_metrics_need_the_token_or_an_allowed_address(transactional_db, client, settings):
    settings.WARDEN = {**settings.WARDEN, "METRICS_TOKEN": "scrape-secret-123", "METRICS_ALLOW": ["10.0.0.0/8"]}
    assert client.get("/metrics").status_code == 403  # the test client is 127.0.0.1: not listed now
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    scraped = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret-123")
    assert scraped.status_code == 200 and scraped["Content-Type"].startswith("text/plain; version=0.0.4")
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200
    assert b"scrape-secret-123" not in scraped.content


FORWARDED = [("HTTP_X_FORWARDED_FOR", "203.0.113.9"), ("HTTP_FORWARDED", "for=203.0.113.9"),
             ("HTTP_X_REAL_IP", "203.0.113.9")]  # fmt: skip


@pytest.mark.parametrize("header,value", FORWARDED, ids=[h for h, _ in FORWARDED])
def test_metrics_refuse_what_a_proxy_nobody_named_forwards_from_loopback(transactional_db, client, settings,
                                                                         header, value):  # fmt: skip
    """A proxy on this host makes every client 127.0.0.1: the loopback allowance must not open /metrics."""
    from dashboard.management.commands.serve_metrics import metrics_app

    settings.WARDEN = {**settings.WARDEN, "METRICS_TOKEN": "scrape-secret-123"}  # METRICS_ALLOW: loopback
    assert client.get("/metrics").status_code == 200  # a scraper on this machine, straight to Warden
    refused = client.get("/metrics", **{header: value})
    assert refused.status_code == 403 and b"warden_" not in refused.content
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret-123", **{header: value}).status_code == 200
    answers = []
    metrics_app({"PATH_INFO": "/metrics", "REMOTE_ADDR": "127.0.0.1", header: value}, lambda s, h: answers.append(s))
    assert answers == ["403 Forbidden"]
    # Named, the proxy's header says who the client is: this machine's scraper, or someone else.
    settings.WARDEN = {**settings.WARDEN, "TRUSTED_PROXY_COUNT": 1}
    assert client.get("/metrics", HTTP_X_FORWARDED_FOR="127.0.0.1").status_code == 200
    assert client.get("/metrics", HTTP_X_FORWARDED_FOR="203.0.113.9").status_code == 403


def _samples(text: str, name: str) -> dict[str, float]:
    """{labels: value} of one metric in the Prometheus text format."""
    found = {}
    for line in text.splitlines():
        match = re.match(rf"^{name}(\{{[^}}]*\}})? (\S+)$", line)
        if match:
            found[match.group(1) or ""] = float(match.group(2))
    return found


@pytest.mark.processes
def test_metrics_count_the_steps_of_real_worker_processes(demo_tx, operator, client, processes):
    """The worker processes' counters reach /metrics (summed over the host's processes), beside the state
    read at scrape time; no run id is a label; the workers page lists the live process."""

    def scrape() -> str:
        return client.get("/metrics").content.decode()

    before = scrape()
    if SCALED:
        worker = processes.worker(threads=2)
    else:  # embedded: the server process runs the work, and answers Prometheus itself
        port = free_port()
        worker = processes.server(port=port)
    runs = [run_start(workflow="deploy-review") for _ in range(2)]
    wait_for(lambda: all(Run.objects.get(id=r.id).is_terminal for r in runs), timeout=90, message="the runs")

    def grew(name, labels, text=None):
        return _samples(text or scraped, name).get(labels, 0) - _samples(before, name).get(labels, 0)

    def finishes_counted():
        text = scrape()
        return text if grew("warden_runs_finished_total", '{status="completed"}', text) >= 2 else None

    # A run's finish is counted by its worker just after the commit the test saw: scrape until it shows.
    scraped = text = wait_for(finishes_counted, timeout=30, message="the runs' finish counted")

    model_steps = grew("warden_steps_total", '{kind="model_call",outcome="ok"}')
    assert model_steps >= 2 * 3 and grew("warden_steps_total", '{kind="tool_call",outcome="ok"}') >= 2
    assert grew("warden_model_calls_total", '{outcome="ok",provider="scripted"}') == model_steps
    assert grew("warden_runs_finished_total", '{status="completed"}') == 2
    assert _samples(text, "warden_runs")['{status="running"}'] == 0
    assert _samples(text, "warden_workers")['{state="live"}'] >= 1
    assert _samples(text, "warden_queue_messages")['{queue="warden"}'] >= 0  # the broker's own queue, read
    assert not re.search(r'run(_id)?="', text)  # no run ids among the labels
    if not SCALED:
        served = wait_for(lambda: _safe(f"http://127.0.0.1:{port}/metrics"), timeout=30, message="the server")
        assert "warden_steps_total" in served

    client.force_login(operator)
    page = client.get("/workers/").content.decode()
    pids = [worker.pid, *processes.children(worker)]
    assert any(f'id="worker-{pid}"' in page for pid in pids), page


def _safe(url):
    try:
        return urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return None  # not listening yet


# --- workers --------------------------------------------------------------------------------------------
def test_a_worker_that_stopped_stamping_is_shown_gone_with_the_tasks_it_held(demo_tx, operator, client):
    from django.utils import timezone

    run = run_start(workflow="deploy-review")
    now = timezone.now()
    WorkerProcess.objects.create(name="w1:41", host="w1", pid=41, threads=4, started_at=now, beat_at=now)
    old = now - timezone.timedelta(seconds=settings.WARDEN["LEASE_SECONDS"] + 5)
    WorkerProcess.objects.create(name="w2:42", host="w2", pid=42, threads=4, started_at=old, beat_at=old)
    task = run.tasks.get(key="inventory")
    type(task).objects.filter(id=task.id).update(status="running", lease_owner="w2:42:7", lease_expires_at=now)
    client.force_login(operator)
    from tenancy.tokens import api_token_create

    token = api_token_create(user=operator, scopes=["read"])[1]
    listed = client.get("/api/v1/workers", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert [(w["name"], w["state"]) for w in listed] == [("w1:41", "live"), ("w2:42", "gone")]
    (held,) = listed[1]["tasks"]
    assert (held["task_id"], held["run_id"], held["key"]) == (task.id, run.id, "inventory") and held["lease_expires_at"]
    page = client.get("/workers/").content.decode()
    assert 'class="worker-gone"' in page and f"run {run.id} · inventory" in page


# --- logs and the doctor --------------------------------------------------------------------------------
LOG_SNIPPET = """
import logging, django
django.setup()
from core.logs import log_context
with log_context(run=7, task=12, attempt=2):
    logging.getLogger("warden.engine").warning("step %s journaled", 3)
"""


@pytest.mark.parametrize("form", ["json", "plain"])
def test_log_lines_carry_the_ids_of_what_they_are_about(form):
    """As the settings configure the console: WARDEN_LOG_FORMAT=json writes one JSON object a line."""
    import os
    import sys

    from tests.conftest import ROOT

    env = dict(os.environ, DJANGO_SETTINGS_MODULE="config.settings.test", WARDEN_LOG_FORMAT=form)
    done = subprocess.run([sys.executable, "-c", LOG_SNIPPET], cwd=ROOT, env=env, capture_output=True, text=True)
    (line,) = [line for line in done.stderr.splitlines() if "journaled" in line]
    if form == "json":
        entry = json.loads(line)
        assert entry["message"] == "step 3 journaled" and entry["level"] == "WARNING"
        assert (entry["run"], entry["task"], entry["attempt"]) == (7, 12, 2)
    else:
        assert line.endswith("step 3 journaled run=7 task=12 attempt=2")


def test_doctor_says_what_is_wrong_and_how_to_fix_it(transactional_db, settings, capsys):
    settings.DEBUG = False
    settings.WARDEN = {**settings.WARDEN, "DRILL_FAULTS": True, "PRODUCTION": True}
    with pytest.raises(SystemExit) as exited:
        call_command("doctor")
    out = capsys.readouterr().out
    assert exited.value.code == 1
    assert "WARDEN_DRILL_FAULTS" in out and "no worker" in out.lower()
    assert SQLITE or "redis" in out.lower()
    if not SQLITE:  # this machine's PostgreSQL runs without autovacuum (CI): the doctor says so
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SHOW autovacuum")
            on = cursor.fetchone()[0] == "on"
        assert ("autovacuum is on" in out) if on else ("autovacuum is off" in out and "autovacuum = on" in out)


def _doctor(capsys) -> str:
    try:
        call_command("doctor")
    except SystemExit:  # no worker runs here: that is an error, and beside the point
        pass
    return capsys.readouterr().out


def test_doctor_warns_of_a_proxy_nobody_named_for_logins_and_metrics(transactional_db, client, settings, capsys,
                                                                      tmp_path):  # fmt: skip
    from tenancy import proxies

    settings.VAR_DIR = tmp_path
    proxies._last_noted[0] = float("-inf")
    assert "reverse proxy" not in _doctor(capsys)  # nothing came through a proxy yet
    assert client.get("/healthz", HTTP_X_FORWARDED_FOR="203.0.113.9").status_code == 200
    out = _doctor(capsys)
    proxy_line = next(line for line in out.splitlines() if "reverse proxy" in line)
    assert proxy_line.startswith("warn") and "X-Forwarded-For from 127.0.0.1" in proxy_line
    assert "lock everyone out" in proxy_line and "set WARDEN_TRUSTED_PROXY_COUNT" in out
    assert "/metrics has no token" in out and "set WARDEN_METRICS_TOKEN" in out
    assert "203.0.113.9" not in out  # the client's address is not kept, only the proxy's

    settings.WARDEN = {**settings.WARDEN, "METRICS_TOKEN": "scrape-secret-123"}
    out = _doctor(capsys)
    assert "reverse proxy" in out and "/metrics has no token" not in out
    settings.WARDEN = {**settings.WARDEN, "METRICS_TOKEN": ""}
    proxies._last_noted[0] = float("-inf")
    client.get("/healthz", REMOTE_ADDR="192.0.2.20", HTTP_X_FORWARDED_FOR="203.0.113.9")  # a proxy elsewhere
    out = _doctor(capsys)
    assert "from 192.0.2.20" in out and "lock everyone out" in out and "/metrics has no token" not in out
    settings.WARDEN = {**settings.WARDEN, "TRUSTED_PROXY_COUNT": 1}
    out = _doctor(capsys)
    assert "reverse proxy" not in out and "trusted proxies: 1" in out
    settings.WARDEN = {**settings.WARDEN, "TRUSTED_PROXY_COUNT": 0}
    note = tmp_path / proxies.SIGHTING_FILE  # long ago: that proxy is taken to be gone
    note.write_text(json.dumps({**json.loads(note.read_text()), "at": "2020-01-01T00:00:00+00:00"}))
    assert "reverse proxy" not in _doctor(capsys)


def test_a_worker_only_host_serves_its_own_metrics_to_allowed_scrapers(settings):
    from core import metrics
    from dashboard.management.commands.serve_metrics import metrics_app

    metrics.STEPS.labels("model_call", "ok").inc(0)  # this process's file has the series
    answers = []

    def call(address):
        body = metrics_app({"PATH_INFO": "/metrics", "REMOTE_ADDR": address}, lambda s, h: answers.append(s))
        return answers[-1], b"".join(body).decode()

    status, body = call("127.0.0.1")
    assert status == "200 OK" and "warden_steps_total" in body
    assert call("192.0.2.7")[0] == "403 Forbidden"


def test_the_alert_rules_and_the_dashboard_use_only_metrics_warden_exposes(db):
    """docs/warden-alerts.yml and docs/grafana-warden.json name no metric that does not exist."""
    from pathlib import Path

    from prometheus_client import Counter, Histogram

    from core import metrics

    exposed = {family.name for family in ops.StateCollector().collect()}
    for thing in vars(metrics).values():
        if isinstance(thing, Counter):
            exposed.add(f"{thing._name}_total")
        elif isinstance(thing, Histogram):
            exposed |= {f"{thing._name}_{suffix}" for suffix in ("bucket", "sum", "count")}
    docs = Path(__file__).resolve().parents[2] / "docs"
    for name in ("warden-alerts.yml", "grafana-warden.json"):
        used = set(re.findall(r"\bwarden_[a-z_]+", (docs / name).read_text()))
        assert used and used <= exposed, (name, used - exposed)
