"""The live OTLP export (integrations/otlp.py): with OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set, every span of a run goes
to the collector once, soon after it closes, through the OpenTelemetry SDK's OTLP/HTTP exporter, with the
GenAI conventions and the provider that actually answered; a collector that refuses gets the same spans
again in the next pass. Tested against a local OTLP receiver."""

import http.server
import threading
import time

import psycopg
import pytest
from django.db import connection
from django.utils import timezone
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from integrations import otlp
from integrations.models import OtlpExportCursor
from runs.models import Run, Span
from runs.services import run_start
from tests.conftest import wait_for
from tests.runs.test_engine import finished


class Collector:
    """An OTLP/HTTP receiver: keeps every exported span; answers ``status``."""

    def __init__(self):
        self.spans: list = []
        self.status = 200
        self.refused = 0
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                collector.refused += collector.status != 200
                if collector.status == 200:
                    request = ExportTraceServiceRequest.FromString(body)
                    for resource_spans in request.resource_spans:
                        resource = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
                        for scope in resource_spans.scope_spans:
                            collector.spans += [(resource, span) for span in scope.spans]
                self.send_response(collector.status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/traces"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()


@pytest.fixture
def collector(monkeypatch):
    """The receiver, and the export pointed at it from the first pass on (the cursor made before the
    test's run, by this pass or the worker's sweeper: either may make passes, as in production)."""
    receiver = Collector()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")  # the SDK retries a failed export until then
    monkeypatch.setattr(otlp, "_exporter", None)
    # The production lag: a span is stamped before its transaction commits (the worker's sweeper passes
    # while the run goes on), so with no lag a pass could step past a span not yet committed.
    wait_for(lambda: otlp.otlp_export_pass() is not None and OtlpExportCursor.objects.exists(), message="a cursor")
    yield receiver
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")  # no pass sends to it once it is gone
    receiver.httpd.shutdown()
    receiver.httpd.server_close()


def attributes(span) -> dict:
    out = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind)
    return out


def exported_all(collector, run) -> bool:
    """Pass after pass (the worker's sweeper makes them too), until the run's spans are at the collector."""
    otlp.otlp_export_pass()
    wanted = set(Span.objects.filter(run=run).values_list("id", flat=True))
    return {int.from_bytes(s.span_id, "big") for _, s in collector.spans} >= wanted


def test_every_span_of_a_run_goes_to_the_collector_once_with_the_genai_conventions(demo_tx, worker, collector):
    run = finished(run_start(workflow="deploy-review"))
    assert run.status == Run.Status.COMPLETED
    # Generous: under the CI's load a pass can wait behind the worker's own export of the same spans.
    wait_for(lambda: exported_all(collector, run), timeout=90, message="the run's spans at the collector")
    ids = sorted(int.from_bytes(s.span_id, "big") for _, s in collector.spans)
    assert ids == sorted(Span.objects.filter(run=run).values_list("id", flat=True))  # each once, none missing
    assert {s.trace_id.hex() for _, s in collector.spans} == {otlp.trace_id(run.id)}
    # A model call that answered (risk's first one times out in this workflow: an error span, no tokens).
    answered = [(r, s) for r, s in collector.spans if s.status.code == s.status.STATUS_CODE_OK]
    model = [(r, s) for r, s in answered if attributes(s).get("warden.span.kind") == "model_call"]
    resource, span = model[0]
    found = attributes(span)
    assert found["gen_ai.operation.name"] == "chat" and found["gen_ai.provider.name"] == "scripted"
    assert found["gen_ai.usage.input_tokens"] > 0 and found["gen_ai.request.model"] == span.name.split(" ", 1)[1]
    assert resource["service.name"] == "warden" and resource["warden.workflow"] == "deploy-review"
    # Parents are spans of the same trace (the run's root has none).
    known = set(ids)
    assert all(int.from_bytes(s.parent_span_id, "big") in known for _, s in collector.spans if s.parent_span_id)
    for _ in range(3):
        otlp.otlp_export_pass()
        time.sleep(0.1)
    assert len(collector.spans) == len(ids)  # nothing twice


def test_a_collector_that_refuses_gets_the_same_spans_in_the_next_pass(demo_tx, worker, collector):
    collector.status = 400
    run = finished(run_start(workflow="deploy-review"))
    wait_for(lambda: otlp.otlp_export_pass() is not None and collector.refused, message="a refused export")
    assert collector.spans == []
    collector.status = 200
    wait_for(lambda: exported_all(collector, run), message="the same spans, accepted")
    ids = [int.from_bytes(s.span_id, "big") for _, s in collector.spans]
    assert sorted(ids) == sorted(Span.objects.filter(run=run).values_list("id", flat=True))


def test_the_download_names_the_provider_that_answered_not_the_agents(demo, operator, client):
    from tenancy.tokens import api_token_create

    run = run_start(workflow="deploy-review")
    task = run.tasks.first()
    now = timezone.now()
    answered = {"text": "", "provider": "anthropic"}  # the fallback answered, not the agent's provider
    Span.objects.create(run=run, task=task, kind="model_call", name="claude-test", status="ok", started_at=now,
                        ended_at=now, tokens_in=10, tokens_out=2, body=answered)  # fmt: skip
    token = api_token_create(user=operator)[1]
    document = client.get(f"/api/v1/runs/{run.id}/trace/otlp", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    spans = document["resourceSpans"][0]["scopeSpans"][0]["spans"]
    [chat] = [s for s in spans if s["name"] == "chat claude-test"]
    found = {a["key"]: next(iter(a["value"].values())) for a in chat["attributes"]}
    assert found["gen_ai.provider.name"] == "anthropic" and found["gen_ai.system"] == "anthropic"
    assert len(chat["traceId"]) == 32 and len(chat["spanId"]) == 16  # hex, as OTLP/JSON writes ids


@pytest.mark.skipif(connection.vendor != "postgresql", reason="open transactions are read from pg_stat_activity")
def test_a_span_committed_long_after_its_end_is_stamped_still_goes_out(demo_tx, collector):
    """A worker stamps a span's end, then its transaction stays open past the lag (a slow commit under load):
    the pass meanwhile must not step past it, or the span lands behind the cursor and never goes out."""
    run = run_start(workflow="deploy-review")
    root = Span.objects.get(run=run, kind="run")
    settings = connection.settings_dict
    slow = psycopg.connect(host=settings["HOST"], port=settings["PORT"] or 5432, user=settings["USER"],
                           dbname=settings["NAME"], password=settings["PASSWORD"] or None)  # fmt: skip
    try:
        with slow.cursor() as cursor:
            cursor.execute(
                "INSERT INTO runs_span (run_id, task_id, parent_id, kind, name, status, attempt, step,"
                " fencing_token, started_at, ended_at, tokens_in, tokens_out, cost_micros, attributes)"
                " VALUES (%s, NULL, %s, 'tool_call', 'late', 'ok', NULL, NULL, NULL, now(), now(), 0, 0, 0, '{}')"
                " RETURNING id",
                (run.id, root.id),
            )
            (late,) = cursor.fetchone()
        # Meanwhile another worker's span, later in id, closes and commits: the pass sends it and moves on.
        moment = timezone.now()
        Span.objects.create(run=run, parent=root, kind="tool_call", name="prompt", status="ok",
                            started_at=moment, ended_at=moment)  # fmt: skip
        time.sleep(otlp.EXPORT_LAG.total_seconds() + 0.5)
        otlp.otlp_export_pass()  # the late span is stamped well before `now - lag`, and not yet committed
        slow.commit()
    finally:
        slow.close()
    wait_for(lambda: otlp.otlp_export_pass() is not None and late in exported_ids(collector), timeout=30,
             message="the late span at the collector")  # fmt: skip


def exported_ids(collector) -> set[int]:
    return {int.from_bytes(s.span_id, "big") for _, s in collector.spans}
