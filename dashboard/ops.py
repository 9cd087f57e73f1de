"""Operating Warden itself: readiness of what it depends on, the figures GET /metrics reads at scrape time,
who may scrape, and which workers may be listed to whom.

The counters and histograms are the processes' own (core/metrics.py, summed over the multiprocess
directory); what is a state of the database or the queue (runs in flight, backlogs and their ages, open
breakers, workers) is read here when Prometheus asks, each with one cheap indexed query, so a scrape shows
the truth even when no worker runs.
"""

import asyncio
import hmac
import ipaddress
import json
import logging
import time
import uuid

import dramatiq
import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import DatabaseError, connection
from django.db.migrations.loader import MigrationLoader
from django.db.models import Count, Min
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from core import metrics
from integrations.models import WebhookDelivery
from policy.models import ApprovalRequest
from runs.models import Outbox, Run, Task, WorkerProcess
from runs.services.breakers import BREAKERS
from runs.workers import gone_after
from tenancy.audit import client_address
from tenancy.models import Project
from tenancy.proxies import is_loopback, via_unnamed_proxy

log = logging.getLogger("warden.ops")
ACTIVE_RUNS = [s for s in Run.Status.values if s not in Run.TERMINAL]

# --- readiness ------------------------------------------------------------------------------------------
_leaves: set[tuple[str, str]] | None = None  # the migrations on disk: read once per process
_migrated = False  # once seen applied, they stay applied: later checks only reach the database


def database_state() -> str:
    global _leaves, _migrated
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            if _migrated:
                return "ok"
            if _leaves is None:
                _leaves = set(MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes())
            applied = set()
            if "django_migrations" in connection.introspection.table_names(cursor):  # none on a new database
                cursor.execute("SELECT app, name FROM django_migrations")
                applied = set(cursor.fetchall())
            missing = _leaves - applied
    except Exception as exc:  # a refused, reset or timed-out connection: the next check connects anew
        log.warning("readiness: database unreachable: %s", type(exc).__name__)
        connection.close()
        return "unreachable"
    _migrated = not missing
    return "ok" if _migrated else "migrations pending"


_redis_clients: dict[str, redis.Redis] = {}


def redis_state() -> str:
    url = settings.REDIS_URL
    client = _redis_clients.get(url) or _redis_clients.setdefault(
        url, redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        log.warning("readiness: redis unreachable: %s", type(exc).__name__)
        return "unreachable"
    return "ok"


async def _layer_round_trip() -> None:
    layer = get_channel_layer()
    channel = f"warden-readyz.{uuid.uuid4().hex}"  # a plain channel: received at once, no process-wide reader
    await layer.send(channel, {"type": "readyz"})
    await layer.receive(channel)


def channel_layer_state() -> str:
    try:
        async_to_sync(asyncio.wait_for)(_layer_round_trip(), 2)
    except Exception as exc:
        log.warning("readiness: channel layer did not answer: %s", type(exc).__name__)
        return "unreachable"
    return "ok"


def readiness() -> dict[str, str]:
    """ok, or what is wrong, per dependency: the database (reachable, migrated), Redis (scaled mode) and the
    channel layer. Nothing else: the answer is public."""
    checks = {"database": database_state()}
    if settings.REDIS_URL:
        checks["redis"] = redis_state()
        # The channel layer lives in the same Redis: asked only when Redis answers (a dead Redis would
        # make it wait out its own timeouts).
        checks["channel_layer"] = channel_layer_state() if checks["redis"] == "ok" else "unreachable"
    else:
        checks["channel_layer"] = channel_layer_state()
    return checks


# --- who may scrape -------------------------------------------------------------------------------------
def metrics_allowed(request) -> bool:
    return metrics_allowed_for(
        authorization=request.headers.get("Authorization", ""),
        address=client_address(request),
        via_unnamed_proxy=via_unnamed_proxy(request.META),
    )


def metrics_allowed_for(*, authorization: str, address: str | None, via_unnamed_proxy: bool = False) -> bool:
    """The bearer token of WARDEN_METRICS_TOKEN, or a client address in WARDEN_METRICS_ALLOW. A loopback
    address that came with forwarding headers while no proxy is named (WARDEN_TRUSTED_PROXY_COUNT 0) is a
    proxy on this host speaking for someone unknown: it is not let in by its address (the token still is)."""
    token = settings.WARDEN["METRICS_TOKEN"]
    if token and authorization.startswith("Bearer ") and _same(authorization.removeprefix("Bearer "), token):
        return True
    if via_unnamed_proxy and is_loopback(address):
        return False
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return False
    return any(ip in ipaddress.ip_network(n, strict=False) for n in settings.WARDEN["METRICS_ALLOW"])


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


# --- the scrape -----------------------------------------------------------------------------------------
def _age(now, then) -> float:
    return max(0.0, (now - then).total_seconds()) if then else 0.0


def _queue_figures() -> list[tuple[str, int, float]]:
    """(queue, messages waiting, age in seconds of the oldest) for each queue this process declared."""
    broker, now, figures = dramatiq.get_broker(), time.time(), []
    for queue in sorted(broker.get_declared_queues()):
        if hasattr(broker, "client"):  # Redis: a list of ids and a hash of bodies (dramatiq's layout)
            key = f"{broker.namespace}:{queue}"
            depth = broker.client.llen(key)
            first = broker.client.lindex(key, 0)
            body = broker.client.hget(f"{key}.msgs", first) if first else None
            oldest = json.loads(body)["message_timestamp"] / 1000 if body else None
        else:  # the embedded in-memory broker
            waiting = broker.queues[queue]
            depth = waiting.qsize()
            head = list(waiting.queue)[:1]
            oldest = dramatiq.Message.decode(head[0]).message_timestamp / 1000 if head else None
        # a delayed queue's messages wait on purpose (retries, backoff): their age says nothing
        age = max(0.0, now - oldest) if oldest and not queue.endswith(".DQ") else 0.0
        figures.append((queue, depth, age))
    return figures


class StateCollector:
    """What the database and the queue say now, read when Prometheus scrapes."""

    def collect(self):
        now = timezone.now()
        try:  # whole or not at all: the families are built before any is yielded
            from_database = [*self._runs_and_backlogs(now), *self._workers(now)]
        except DatabaseError as exc:  # the processes' counters still go out: they matter most then
            log.warning("metrics: database figures unavailable: %s", type(exc).__name__)
            connection.close()
            from_database = []
        yield GaugeMetricFamily("warden_database_figures", "1 when this scrape could read the database's figures",
                                value=1 if from_database else 0)  # fmt: skip
        yield from from_database
        yield from self._queues()
        yield self._breakers()

    def _breakers(self):
        """Open and half-open breakers: a project's own tool's with its project (two projects' tools of the
        same name are two breakers), the deployment's with an empty project."""
        breakers = GaugeMetricFamily("warden_breaker_open", "1 while a breaker is open or half-open",
                                     labels=["kind", "project", "name", "state"])  # fmt: skip
        found = [s for breaker in BREAKERS.values() for s in breaker.open_now()]
        ids = {s.ref.project_id for s in found if s.ref.project_id}
        try:
            slugs = dict(Project.objects.filter(id__in=ids).values_list("id", "slug")) if ids else {}
        except DatabaseError:  # the database away: the project's id names it for this scrape
            connection.close()
            slugs = {}
        for s in found:
            if s.ref.project_id is None:
                project, name = "", metrics.bounded(s.ref.name)
            else:
                project, name = metrics.bounded_pair(slugs.get(s.ref.project_id, s.ref.project_id), s.ref.name)
            breakers.add_metric([s.ref.what, project, name, s.state], 1)
        return breakers

    def _runs_and_backlogs(self, now):
        runs = GaugeMetricFamily("warden_runs", "Runs not finished, by status", labels=["status"])
        counted = dict(
            Run.objects.filter(status__in=ACTIVE_RUNS).values_list("status").annotate(n=Count("id")).order_by()
        )
        for status in ACTIVE_RUNS:
            runs.add_metric([status], counted.get(status, 0))
        yield runs
        for name, help_, rows, since in (
            ("outbox", "Outbox messages not yet handed to the queue", Outbox.objects, "created_at"),
            (
                "approvals_waiting",
                "Approval requests waiting for a decision",
                ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING),
                "requested_at",
            ),
            (
                "webhooks_pending",
                "Webhook deliveries waiting to be sent or retried",
                WebhookDelivery.objects.filter(status=WebhookDelivery.Status.PENDING),
                "created_at",
            ),
        ):
            found = rows.aggregate(n=Count("id"), oldest=Min(since))
            yield GaugeMetricFamily(f"warden_{name}", help_, value=found["n"])
            yield GaugeMetricFamily(f"warden_{name}_oldest_age_seconds", f"Age of the oldest: {help_}",
                                    value=_age(now, found["oldest"]))  # fmt: skip
        past = ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING, expires_at__lt=now).count()
        yield GaugeMetricFamily(
            "warden_approvals_past_expiry", "Pending approval requests past their expiry", value=past
        )
        expired = Task.objects.filter(status=Task.Status.RUNNING, lease_expires_at__lt=now).count()
        yield GaugeMetricFamily(
            "warden_leases_expired", "Running tasks whose lease expired, not yet recovered", value=expired
        )

    def _queues(self):
        depth = GaugeMetricFamily("warden_queue_messages", "Messages waiting in a queue", labels=["queue"])
        age = GaugeMetricFamily("warden_queue_oldest_age_seconds", "Age of a queue's oldest message", labels=["queue"])
        try:
            for queue, waiting, oldest in _queue_figures():
                depth.add_metric([queue], waiting)
                age.add_metric([queue], oldest)
        except Exception as exc:  # Redis away: the queue figures are missing from this scrape, not wrong
            log.warning("metrics: queue figures unavailable: %s", type(exc).__name__)
        yield depth
        yield age

    def _workers(self, now):
        states = {"live": 0, "gone": 0}
        swept = None
        for beat_at, swept_at, stopped_at in WorkerProcess.objects.values_list("beat_at", "swept_at", "stopped_at"):
            if stopped_at:
                continue
            live = _age(now, beat_at) <= gone_after()
            states["live" if live else "gone"] += 1
            if live and swept_at and (swept is None or swept_at > swept):
                swept = swept_at
        workers = GaugeMetricFamily(
            "warden_workers", "Worker processes, live or gone (stopped stamping)", labels=["state"]
        )
        for state, n in states.items():
            workers.add_metric([state], n)
        yield workers
        yield GaugeMetricFamily("warden_sweeper_lag_seconds", "Since the last pass of any live worker's sweeper",
                                value=_age(now, swept) if swept else float("nan"))  # fmt: skip


def metrics_text() -> bytes:
    """The Prometheus text exposition: every process's counters and histograms, then the state."""
    registry = CollectorRegistry()
    if metrics.multiprocess():
        MultiProcessCollector(registry)
    registry.register(StateCollector())
    return generate_latest(registry)
