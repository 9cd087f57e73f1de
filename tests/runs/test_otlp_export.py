"""The live OTLP export (runs/otlp.py): with OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set, every span of a run goes
to the collector once, soon after it closes, through the OpenTelemetry SDK's OTLP/HTTP exporter, with the
GenAI conventions and the provider that actually answered; a collector that refuses gets the same spans
again in the next pass. Tested against a local OTLP receiver."""

import http.server
import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from runs import otlp
from runs.models import Run, Span
from runs.services import run_start
from tests.runs.test_engine import finished


class Collector:
    """An OTLP/HTTP receiver: keeps every exported span; answers ``status``."""

    def __init__(self):
        self.spans: list = []
        self.status = 200
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
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
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def collector(monkeypatch):
    receiver = Collector()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url)
    monkeypatch.setattr(otlp, "_exporter", None)
    monkeypatch.setattr(otlp, "EXPORT_LAG", timedelta(0))  # one process: no clocks to wait for
    yield receiver
    receiver.httpd.shutdown()
    receiver.httpd.server_close()


def attributes(span) -> dict:
    out = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind)
    return out


def passes(count=10) -> int:
    """The sweeper's passes, a little apart."""
    exported = 0
    for _ in range(count):
        exported += otlp.otlp_export_pass().get("otlp_exported", 0)
        time.sleep(0.05)
    return exported


def test_every_span_of_a_run_goes_to_the_collector_once_with_the_genai_conventions(demo_tx, worker, collector):
    assert otlp.otlp_export_pass() == {"otlp_exported": 0}  # the first pass starts from now
    run = finished(run_start(workflow="deploy-review"))
    assert run.status == Run.Status.COMPLETED
    passes()  # the worker's own sweeper makes passes too: each span goes out once all the same
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
    passes(3)
    assert len(collector.spans) == len(ids)  # nothing twice


def test_a_collector_that_refuses_gets_the_same_spans_in_the_next_pass(demo_tx, worker, collector):
    otlp.otlp_export_pass()
    run = finished(run_start(workflow="deploy-review"))
    collector.status = 400
    assert otlp.otlp_export_pass().get("otlp_failed")
    collector.status = 200
    passes()
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
