"""OTLP ingest: an OpenTelemetry trace export (protobuf or JSON) sent to /v1/traces with an API token
becomes an external run's trace: model calls with tokens and cost by the GenAI conventions, tool calls,
the agent's other steps; grouped by the run a span names or by trace; sent twice, kept once; a bad or
too large payload is refused with the reason and writes nothing."""

import json

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Status
from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan

from agents.models import ModelPrice, Workflow
from runs.models import OtlpTrace, Run, Span
from tenancy.models import Project
from tests.runs.test_external_agent import call, people  # noqa: F401  (the fixture)

TRACE = bytes.fromhex("5b8efff798038103d269b633813fc60c")
T0 = 1_764_000_000_000_000_000


def kv(key, value) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def span(n: int, name: str, *, trace=TRACE, error=False, **attributes) -> OtlpSpan:
    return OtlpSpan(
        trace_id=trace, span_id=n.to_bytes(8, "big"), name=name,
        start_time_unix_nano=T0 + n * 1_000_000, end_time_unix_nano=T0 + n * 1_000_000 + 500_000,
        attributes=[kv(k.replace("__", "."), v) for k, v in attributes.items()],
        status=Status(code=Status.STATUS_CODE_ERROR if error else Status.STATUS_CODE_OK),
    )  # fmt: skip


def export(*spans, **resource) -> ExportTraceServiceRequest:
    attributes = [kv(k.replace("__", "."), v) for k, v in {"service__name": "refund-bot", **resource}.items()]
    return ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(resource={"attributes": attributes}, scope_spans=[ScopeSpans(spans=list(spans))])]
    )


AGENT_TRACE = [
    span(1, "invoke_agent refund-bot", gen_ai__operation__name="invoke_agent"),
    span(2, "chat gpt-test", gen_ai__operation__name="chat", gen_ai__provider__name="openai",
         gen_ai__request__model="gpt-test", gen_ai__usage__input_tokens=1000, gen_ai__usage__output_tokens=200),
    span(3, "execute_tool lookup", gen_ai__operation__name="execute_tool", gen_ai__tool__name="crm.lookup"),
    span(4, "chat gpt-test", gen_ai__operation__name="chat", gen_ai__system="openai", gen_ai__request__model="gpt-test",
         gen_ai__usage__input_tokens=300, gen_ai__usage__output_tokens=50, error=True),
]  # fmt: skip


def post(client, token, body: bytes, content_type="application/x-protobuf", path="/v1/traces", **headers):
    return client.post(path, data=body, content_type=content_type, HTTP_AUTHORIZATION=f"Bearer {token}", **headers)


@pytest.fixture
def priced(db):
    ModelPrice.objects.create(provider="openai", model="gpt-test", input_usd_per_mtok="2.5", output_usd_per_mtok="10")


def test_a_protobuf_export_becomes_an_external_runs_trace_and_a_resend_is_kept_once(people, client, priced):  # noqa: F811
    agent, _ = people
    body = export(*AGENT_TRACE).SerializeToString()
    answer = post(client, agent, body)
    assert answer.status_code == 200 and answer["Content-Type"] == "application/x-protobuf"
    ExportTraceServiceResponse.FromString(answer.content)  # OTLP's own answer
    run = Run.objects.get(otlp_traces__trace_id=TRACE.hex())
    assert run.workflow.slug == "external-agent" and run.status == "running" and run.goal == "invoke_agent refund-bot"
    kinds = sorted(Span.objects.filter(run=run, attributes__otlp_span_id__isnull=False).values_list("kind", "name"))
    assert kinds == [("model_call", "gpt-test"), ("model_call", "gpt-test"), ("plan", "invoke_agent refund-bot"),
                     ("tool_call", "execute_tool lookup")]  # fmt: skip
    assert Span.objects.filter(run=run, kind="model_call", status="error").count() == 1
    assert (run.tokens_used, run.tool_calls_used, run.steps_used) == (1550, 1, 4)
    assert run.cost_micros == 1000 * 2.5 + 200 * 10 + 300 * 2.5 + 50 * 10  # the price of the provider that answered
    assert run.tasks.get().key == "refund-bot"  # grouped by the agent (service.name)

    assert post(client, agent, body).status_code == 200  # the exporter retries: nothing twice
    run.refresh_from_db()
    assert Span.objects.filter(run=run, attributes__otlp_span_id__isnull=False).count() == 4
    assert run.tokens_used == 1550
    assert OtlpTrace.objects.count() == 1


def test_json_spans_naming_a_run_join_it_and_its_budget_counts(people, client, priced):  # noqa: F811
    agent, _ = people
    run = call(client, agent, "/api/v1/runs", {"workflow": "external-agent", "budget": {"max_tokens": 500}}).json()
    chat = span(9, "chat", trace=bytes(range(16)), gen_ai__provider__name="openai", gen_ai__request__model="gpt-test",
                gen_ai__usage__input_tokens=600, gen_ai__usage__output_tokens=10, gen_ai__agent__name="planner",
                warden__run__id=run["id"])  # fmt: skip
    document = json.loads(json_format.MessageToJson(export(chat)))
    for scope in document["resourceSpans"][0]["scopeSpans"]:  # OTLP/JSON writes ids in hex
        for s in scope["spans"]:
            s["traceId"], s["spanId"] = bytes(range(16)).hex(), (9).to_bytes(8, "big").hex()
    answer = post(client, agent, json.dumps(document).encode(), "application/json", path="/api/v1/otlp/v1/traces")
    assert answer.status_code == 200 and answer.json() == {}
    joined = Run.objects.get(id=run["id"])
    assert joined.tokens_used == 610 and joined.tasks.get().key == "planner"
    assert joined.status == "needs_attention" and "tokens (610 of 500)" in joined.status_reason
    assert not OtlpTrace.objects.exists()  # it went to the run it named, not a run of its own


BAD = [
    (b"\x0a\xff\xff garbage", "application/x-protobuf", "not an OTLP trace export"),
    (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "00"}]}]}]}', "application/json",
     "is not hex"),
    (b"{}", "text/plain", "Content-Type must be"),
    (export(span(1, "x", trace=b"short")).SerializeToString(), "application/x-protobuf", "a trace id is 16 bytes"),
    (export(span(1, "x", warden__run__id="seven")).SerializeToString(), "application/x-protobuf", "is not a run id"),
    (export(span(1, "x"), warden__workflow="deploy-review").SerializeToString(), "application/x-protobuf",
     "no external workflow"),
]  # fmt: skip


@pytest.mark.parametrize("body,content_type,reason", BAD, ids=[b[2][:20] for b in BAD])
def test_a_bad_export_is_refused_with_the_reason_and_writes_nothing(people, client, body, content_type, reason):  # noqa: F811
    agent, _ = people
    answer = post(client, agent, body, content_type)
    assert answer.status_code == 400 and reason in answer.json()["message"], answer.content
    assert not Run.objects.exists() and not Span.objects.exists()


def test_a_workflow_of_a_project_the_sender_is_not_in_answers_as_one_that_does_not_exist(people, client):  # noqa: F811
    agent, _ = people
    elsewhere = Project.objects.create(slug="elsewhere", name="Elsewhere")
    Workflow.objects.create(slug="secret-flow", name="Secret", project=elsewhere, planner="external", tasks=[])

    def answer(slug):
        got = post(client, agent, export(span(1, "x"), warden__workflow=slug).SerializeToString())
        return got.status_code, got.content.decode().replace(slug, "<slug>")

    assert answer("secret-flow") == answer("no-such-flow") and answer("no-such-flow")[0] == 400
    assert not Run.objects.exists() and not Span.objects.exists()


def test_no_token_too_large_and_another_projects_run_are_refused(people, client, settings, django_user_model):  # noqa: F811
    from tenancy.models import Project
    from tenancy.tokens import api_token_create

    agent, _ = people
    body = export(*AGENT_TRACE).SerializeToString()
    assert client.post("/v1/traces", data=body, content_type="application/x-protobuf").status_code == 401
    settings.WARDEN = {**settings.WARDEN, "OTLP_MAX_BYTES": 100}
    assert post(client, agent, body).status_code == 413
    settings.WARDEN = {**settings.WARDEN, "OTLP_MAX_BYTES": 4 * 1024 * 1024}
    stranger = django_user_model.objects.create_user(username="sam", password="x")
    elsewhere = Project.objects.create(slug="elsewhere", name="Elsewhere")
    token = api_token_create(user=stranger, scopes=["read", "run"])[1]
    run = call(client, agent, "/api/v1/runs", {"workflow": "external-agent"}).json()
    named = export(span(1, "x", warden__run__id=run["id"])).SerializeToString()
    assert post(client, token, named).status_code == 404  # not a member of the run's project
    assert (
        post(client, token, export(span(2, "y"), warden__project=elsewhere.slug).SerializeToString()).status_code == 404
    )
    assert not Span.objects.filter(attributes__otlp_span_id__isnull=False).exists()


def test_an_agent_instrumented_with_the_opentelemetry_sdk_shows_up_as_a_run(people, live_url, priced):  # noqa: F811
    """The OpenTelemetry SDK and its OTLP/HTTP exporter, configured as docs/integrations.md says."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    agent, _ = people
    exporter = OTLPSpanExporter(endpoint=f"{live_url}/v1/traces", headers={"Authorization": f"Bearer {agent}"})
    provider = TracerProvider(resource=Resource.create({"service.name": "support-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("my-agent")
    with tracer.start_as_current_span("invoke_agent support-agent") as root:
        root.set_attribute("gen_ai.operation.name", "invoke_agent")
        with tracer.start_as_current_span("chat gpt-test") as chat:
            chat.set_attributes({"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
                                 "gen_ai.request.model": "gpt-test", "gen_ai.usage.input_tokens": 400,
                                 "gen_ai.usage.output_tokens": 100})  # fmt: skip
    provider.force_flush()
    provider.shutdown()
    run = Run.objects.get(otlp_traces__isnull=False)
    assert run.tasks.get().key == "support-agent" and run.tokens_used == 500
    assert run.cost_micros == 400 * 2.5 + 100 * 10
    assert Span.objects.filter(run=run, kind="model_call", name="gpt-test").count() == 1
