"""Serve Warden. Embedded mode (no REDIS_URL): one process serves the dashboard and the API, runs
Dramatiq worker threads on an in-memory broker and the recovery sweeper. Scaled mode: only the ASGI
server; workers are `manage.py rundramatiq` processes."""

import dramatiq
from daphne.endpoints import build_endpoint_description_strings
from daphne.server import Server
from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.management.base import BaseCommand
from django.utils.module_loading import import_string


class Command(BaseCommand):
    help = "Serve the dashboard and API (and, in embedded mode, run the workers in this process)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--threads", type=int, default=settings.WARDEN["EMBEDDED_WORKER_THREADS"])
        parser.add_argument("--no-worker", action="store_true", help="Serve only, even in embedded mode")

    def handle(self, host, port, threads, no_worker, **options):
        worker = None
        if not settings.WARDEN_SCALED and not no_worker:
            worker = dramatiq.Worker(dramatiq.get_broker(), worker_threads=threads, worker_timeout=100)
            worker.start()  # boots the recovery sweeper too (RecoverySweeperMiddleware)
            self.stdout.write(f"embedded mode: {threads} worker threads and the recovery sweeper in this process")
        elif not settings.WARDEN_SCALED:
            self.stdout.write("embedded mode without workers: runs will wait until a server with workers starts")
        else:
            self.stdout.write("scaled mode: start workers with `python manage.py rundramatiq`")
        self.stdout.write(f"serving http://{host}:{port}/", ending="\n")
        self.stdout.flush()
        if worker is not None:
            from twisted.internet import reactor

            # On SIGTERM stop taking work before the HTTP side winds down: an attempt that starts
            # during a slow shutdown would only be cut short. Unfinished work is recovered on restart.
            reactor.addSystemEventTrigger("before", "shutdown", self._stop_worker, worker)
        Server(
            # The project's ASGI application, named by the settings as for any ASGI server (config/asgi.py).
            application=ASGIStaticFilesHandler(import_string(settings.ASGI_APPLICATION)),
            endpoints=build_endpoint_description_strings(host=host, port=port),
            signal_handlers=True,
        ).run()

    @staticmethod
    def _stop_worker(worker) -> None:
        worker.stop(timeout=int(settings.WARDEN["LEASE_SECONDS"] * 1000))
