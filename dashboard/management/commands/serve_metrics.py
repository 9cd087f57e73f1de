"""`manage.py serve_metrics --port 9108`: /metrics of a host that runs workers but no ASGI server.

prometheus_client's multiprocess files are per host: the ASGI server's /metrics sums those of its own host
only. On a host with workers alone, this serves the sum of that host's files (the state figures read from
the database come from the ASGI server's /metrics, once for the whole deployment). The same access rule:
WARDEN_METRICS_TOKEN or a client address in WARDEN_METRICS_ALLOW."""

from wsgiref.simple_server import WSGIRequestHandler, make_server

from django.core.management.base import BaseCommand
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from dashboard.ops import metrics_allowed_for
from tenancy.proxies import forwarding_headers


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):  # one line per scrape every few seconds would drown the worker's log
        pass


def metrics_app(environ, start_response):
    # No proxy is expected in front of this port: the peer's address is the client's, unless forwarding
    # headers say a proxy on this host relays someone else (then only the token lets them in).
    allowed = metrics_allowed_for(
        authorization=environ.get("HTTP_AUTHORIZATION", ""),
        address=environ.get("REMOTE_ADDR"),
        via_unnamed_proxy=bool(forwarding_headers(environ)),
    )
    if environ.get("PATH_INFO") != "/metrics" or not allowed:
        start_response("403 Forbidden", [("Content-Type", "text/plain")])
        return [b"metrics: a token or an allowed address is needed\n"]
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    start_response("200 OK", [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)])
    return [generate_latest(registry)]


class Command(BaseCommand):
    help = "Serve this host's worker metrics (a host without the ASGI server)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=9108)

    def handle(self, host, port, **options):
        self.stdout.write(f"serving this host's worker metrics at http://{host}:{port}/metrics")
        make_server(host, port, metrics_app, handler_class=_Quiet).serve_forever()
