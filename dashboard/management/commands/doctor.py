"""`manage.py doctor`: is this deployment sound? Each check prints ok, or what is wrong and how to fix it;
the exit status is 1 when anything is an error (docs/operations.md)."""

import os

from django.conf import settings
from django.core import checks as django_checks
from django.core.management.base import BaseCommand
from django.db import connection
from django.utils import timezone

from dashboard.ops import channel_layer_state, database_state, redis_state
from runs.models import WorkerProcess
from runs.workers import gone_after
from tools.installation import installation

ERROR, WARNING, OK = "ERROR", "warn", "ok"


class Command(BaseCommand):
    help = "Check the deployment: settings, database, Redis, migrations, workers, installation id."

    def handle(self, **options):
        results = [*self._settings(), *self._services()]
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
