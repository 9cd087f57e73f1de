"""`manage.py doctor`: is this deployment sound? Each check prints ok, or what is wrong and how to fix it;
the exit status is 1 when anything is an error (docs/operations.md)."""

import ipaddress
import os
from datetime import timedelta

from django.conf import settings
from django.core import checks as django_checks
from django.core.management.base import BaseCommand
from django.db import connection
from django.utils import timezone

from dashboard.ops import channel_layer_state, database_state, redis_state
from runs.models import WorkerProcess
from runs.workers import gone_after
from tenancy.proxies import is_loopback, sighting_last
from tools.installation import installation

ERROR, WARNING, OK = "ERROR", "warn", "ok"
SIGHTING_DAYS = 7  # a proxy noted longer ago than this is taken to be gone


class Command(BaseCommand):
    help = "Check the deployment: settings, database, Redis, migrations, workers, installation id."

    def handle(self, **options):
        results = [*self._settings(), *self._proxies(), *self._services()]
        if results[-1][0] == OK:  # the database's line: the rest reads it
            results += [self._autovacuum(), *self._workers_and_installation()]
        results += self._system_checks()
        for level, what, fix in results:
            self.stdout.write(f"{level:5} {what}" + (f"\n      fix: {fix}" if fix else ""))
        errors = sum(level == ERROR for level, _, _ in results)
        self.stdout.write(f"{errors} error(s), {sum(level == WARNING for level, _, _ in results)} warning(s)")
        if errors:
            raise SystemExit(1)

    def _settings(self):
        production, key = settings.WARDEN.get("PRODUCTION"), settings.SECRET_KEY
        if len(key) < 50 or len(set(key)) < 5 or key.startswith("django-insecure-"):
            yield ERROR, "the secret key is short or weak", "set DJANGO_SECRET_KEY to 50+ random characters"
        elif settings.REDIS_URL and not os.environ.get("DJANGO_SECRET_KEY"):
            yield (
                ERROR,
                "the secret key is this host's generated one (var/secret_key)",
                ("set the same DJANGO_SECRET_KEY on every host of a scaled deployment"),
            )
        else:
            yield OK, "secret key set", ""
        hosts = settings.ALLOWED_HOSTS
        if "*" in hosts:
            yield ERROR, "DJANGO_ALLOWED_HOSTS accepts any host name", "list the names the site answers to"
        elif production and set(hosts) <= {"127.0.0.1", "localhost"}:
            yield WARNING, "DJANGO_ALLOWED_HOSTS names this machine only", "list the site's public name(s)"
        else:
            yield OK, f"allowed hosts: {', '.join(hosts)}", ""
        for flag, what in (("DRILL_FAULTS", "drill faults"), ("SANDBOX_TOOLS", "sandbox tools")):
            if production and settings.WARDEN[flag]:
                yield ERROR, f"{what} are on in production", f"unset WARDEN_{flag} (or set it to 0)"

    @staticmethod
    def _proxies():
        """What the web processes noted about requests through a proxy nobody named (tenancy/proxies.py)."""
        seen, count = sighting_last(), settings.WARDEN["TRUSTED_PROXY_COUNT"]
        recent = seen is not None and timezone.now() - seen["at"] < timedelta(days=SIGHTING_DAYS)
        if count or not recent:
            yield OK, f"trusted proxies: {count}" if count else "no request came through an unnamed proxy", ""
            return
        headers = ", ".join(seen["headers"]) or "forwarding headers"
        where = f"{headers} from {seen['peer'] or 'an unknown peer'}, last at {seen['at']:%Y-%m-%d %H:%M} UTC"
        yield (
            WARNING,
            f"requests arrive through a reverse proxy WARDEN_TRUSTED_PROXY_COUNT does not name ({where}): every "
            "client has the proxy's address, so the audit log cannot tell them apart and one person's failed "
            "logins lock everyone out",
            "set WARDEN_TRUSTED_PROXY_COUNT to the number of proxies in front of Warden (1 for one nginx) and "
            "WARDEN_CLIENT_IP_HEADER to the header the nearest one fills (default HTTP_X_FORWARDED_FOR); that "
            "proxy must append the peer's address to it, not pass on what the client sent",
        )
        loopback_allowed = _allows_loopback(settings.WARDEN["METRICS_ALLOW"])
        if is_loopback(seen["peer"]) and loopback_allowed and not settings.WARDEN["METRICS_TOKEN"]:
            yield (
                WARNING,
                "/metrics has no token and lets this machine in by its address, but a proxy on this machine "
                "forwards other clients' requests from loopback: that allowance would open /metrics to them, "
                "so Warden refuses forwarded requests it would let in by loopback alone (a scraper going "
                "through the proxy gets 403)",
                "set WARDEN_METRICS_TOKEN and give it to Prometheus as a bearer token, or scrape Warden's own "
                "port directly (not through the proxy), or name the proxy with WARDEN_TRUSTED_PROXY_COUNT",
            )

    def _services(self):
        state = database_state()
        fixes = {"unreachable": "check DATABASE_URL and that the database answers",
                 "migrations pending": "run `python manage.py migrate`"}  # fmt: skip
        yield (OK, "embedded mode: no Redis needed", "") if not settings.REDIS_URL else self._redis()
        yield (
            (OK, "channel layer answers", "")
            if channel_layer_state() == "ok"
            else (ERROR, "the channel layer does not answer", "check REDIS_URL (the layer lives in the same Redis)")
        )
        if state == "ok":
            yield OK, "database reachable and migrated", ""
        else:
            yield ERROR, f"database: {state}", fixes.get(state, "")

    @staticmethod
    def _autovacuum():
        """Every step rewrites its task's and run's rows: without autovacuum, dead versions pile up in the
        indexes the sweeps read (docs/operations.md)."""
        if connection.vendor != "postgresql":
            return OK, "SQLite: no vacuum needed", ""
        with connection.cursor() as cursor:
            cursor.execute("SHOW autovacuum")
            on = cursor.fetchone()[0] == "on"
        if on:
            return OK, "PostgreSQL's autovacuum is on", ""
        return WARNING, "PostgreSQL's autovacuum is off", "set autovacuum = on (or VACUUM (ANALYZE) on a schedule)"

    def _redis(self):
        if redis_state() == "ok":
            return OK, "redis reachable", ""
        return ERROR, "redis unreachable", "check REDIS_URL and that Redis answers"

    def _workers_and_installation(self):
        now, live, gone = timezone.now(), 0, 0
        for beat_at in WorkerProcess.objects.filter(stopped_at__isnull=True).values_list("beat_at", flat=True):
            if (now - beat_at).total_seconds() <= gone_after():
                live += 1
            else:
                gone += 1
        if live:
            yield OK, f"{live} worker process(es) heartbeating", ""
        else:
            start = "python manage.py rundramatiq" if settings.REDIS_URL else "python manage.py serve"
            yield ERROR, "no worker process is heartbeating: no run can make progress", f"start workers: `{start}`"
        if gone:
            yield (
                WARNING,
                f"{gone} worker process(es) stopped heartbeating (gone)",
                ("their leases expire and others take their tasks over; see /workers/, and the process manager"),
            )
        try:
            yield OK, f"installation id {installation()[0]}", ""
        except Exception as exc:
            yield ERROR, f"installation id: {exc}", "run `python manage.py migrate`, or fix WARDEN_INSTALLATION_ID"

    def _system_checks(self):
        deploy = bool(settings.WARDEN.get("PRODUCTION"))
        for message in django_checks.run_checks(include_deployment_checks=deploy):
            if message.is_silenced() or message.level < django_checks.WARNING:
                continue
            level = ERROR if message.is_serious() else WARNING
            yield level, f"{message.id}: {message.msg}", message.hint or ""


def _allows_loopback(networks: list[str]) -> bool:
    """WARDEN_METRICS_ALLOW lets in this machine's own clients (127.0.0.1 or ::1)."""
    own = [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]
    try:
        allowed = [ipaddress.ip_network(n, strict=False) for n in networks]
    except ValueError:
        return False
    return any(ip in net for ip in own for net in allowed if ip.version == net.version)
