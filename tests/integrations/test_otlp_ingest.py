"""OTLP ingest: an OpenTelemetry trace export (protobuf or JSON) sent to /v1/traces with an API token
becomes an external run's trace: model calls with tokens and cost by the GenAI conventions, tool calls,
the agent's other steps; grouped by the run a span names or by trace; sent twice, kept once; a bad or
too large payload is refused with the reason and writes nothing."""

import base64
import json
import re

import httpx
import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Status
from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan

from agents.models import ModelPrice, Workflow
from dashboard.views.run_page import run_push
from integrations.models import OtlpTrace
from runs.models import Run, Span, Task
from tenancy.models import Project
from tests.integrations.test_external_agent import call, people  # noqa: F401  (the fixture)
from tests.runs.test_run_page import row

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


@pytest.mark.parametrize("ids", [("8464867e96933604", "1234567890123456"), ("0000000000000001", "00000000000000e2")])
def test_a_resend_is_kept_once_when_the_span_ids_read_as_json_numbers(people, client, ids):  # noqa: F811
    """Hex ids like 8464867e96933604 (a float, inf) or all digits are ids, not numbers: the second send adds nothing."""
    agent, _ = people
    spans = [span(1, "invoke_agent refund-bot", gen_ai__operation__name="invoke_agent"),
             span(2, "chat gpt-test", gen_ai__operation__name="chat", gen_ai__request__model="gpt-test",
                  gen_ai__usage__input_tokens=10, gen_ai__usage__output_tokens=5)]  # fmt: skip
    spans[0].span_id, spans[1].span_id = (bytes.fromhex(i) for i in ids)
    spans[1].parent_span_id = spans[0].span_id
    body = export(*spans).SerializeToString()
    assert post(client, agent, body).status_code == 200
    assert post(client, agent, body).status_code == 200
    names = Span.objects.filter(attributes__otlp_span_id__isnull=False).values_list("attributes__otlp_name", flat=True)
    assert sorted(names) == ["chat gpt-test", "invoke_agent refund-bot"]
    assert Run.objects.get().tokens_used == 15
    chat = Span.objects.get(attributes__otlp_span_id=ids[1])
    assert chat.parent.attributes["otlp_span_id"] == ids[0]  # placed under its parent, whose id is also "a number"


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


# --- the tree as the exporter sent it --------------------------------------------------------------------------
def sdk_spans(*, agent_name: str = "") -> dict:
    """A three-level trace made by the real OpenTelemetry SDK: an agent, a chat and a tool under it, and a
    chat inside the tool. Finished spans by name, in the order the SDK exports them (children first)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "support-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("my-agent")
    chat = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-test"}
    with tracer.start_as_current_span("invoke_agent support-agent") as root:
        root.set_attributes(
            {"gen_ai.operation.name": "invoke_agent", **({"gen_ai.agent.name": agent_name} if agent_name else {})}
        )
        with tracer.start_as_current_span("chat plan") as span:
            span.set_attributes({**chat, "gen_ai.usage.input_tokens": 400, "gen_ai.usage.output_tokens": 100})
        with tracer.start_as_current_span("execute_tool lookup") as tool:
            tool.set_attributes({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "crm.lookup"})
            with tracer.start_as_current_span("chat summarise") as inner:
                inner.set_attributes({**chat, "gen_ai.usage.input_tokens": 30, "gen_ai.usage.output_tokens": 20})
    provider.shutdown()
    return {s.name: s for s in memory.get_finished_spans()}


def otlp_json(spans) -> bytes:
    """The SDK's own encoding of the spans, written as OTLP/JSON (ids in hex, as the spec says)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    document = json_format.MessageToDict(encode_spans(spans))
    for resource in document["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for s in scope["spans"]:
                for name in ("traceId", "spanId", "parentSpanId"):
                    if name in s:
                        s[name] = base64.b64decode(s[name]).hex()
    return json.dumps(document).encode()


def send(client, token, spans, encoding: str):
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    if encoding == "json":
        return post(client, token, otlp_json(spans), "application/json")
    return post(client, token, encode_spans(spans).SerializeToString())


def shape(run) -> dict:
    """Each ingested span's parent, by OTLP name (the task's span as "task <key>"), and orphan marks."""
    spans = {s.id: s for s in Span.objects.filter(run=run)}
    return {
        s.attributes["otlp_name"]: (
            spans[s.parent_id].attributes.get("otlp_name") or spans[s.parent_id].name,
            s.attributes.get("otlp_orphan", ""),
        )
        for s in spans.values()
        if "otlp_name" in s.attributes
    }


TREE = {
    "invoke_agent support-agent": ("task support-agent", ""),
    "chat plan": ("invoke_agent support-agent", ""),
    "execute_tool lookup": ("invoke_agent support-agent", ""),
    "chat summarise": ("execute_tool lookup", ""),
}


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_the_sdks_three_level_tree_is_kept_as_sent_and_a_resend_changes_nothing(
    people,  # noqa: F811
    live_url,
    priced,
    encoding,  # noqa: F811
):
    """The real SDK's spans, by its own OTLP/HTTP exporter (protobuf) or its encoder written as OTLP/JSON."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    agent, _ = people
    spans = list(sdk_spans().values())
    exporter = OTLPSpanExporter(endpoint=f"{live_url}/v1/traces", headers={"Authorization": f"Bearer {agent}"})

    def export_once():
        if encoding == "protobuf":
            assert exporter.export(spans) == SpanExportResult.SUCCESS
        else:
            answer = httpx.post(f"{live_url}/v1/traces", content=otlp_json(spans), headers={
                "Authorization": f"Bearer {agent}", "Content-Type": "application/json"})  # fmt: skip
            assert answer.status_code == 200, answer.text

    export_once()
    run = Run.objects.get(otlp_traces__isnull=False)
    assert shape(run) == TREE
    before = list(Span.objects.filter(run=run).order_by("id").values())
    usage = Run.objects.filter(id=run.id).values("tokens_used", "steps_used", "tool_calls_used", "cost_micros").get()
    assert usage == {"tokens_used": 550, "steps_used": 4, "tool_calls_used": 1, "cost_micros": 430 * 2.5 + 120 * 10}
    export_once()  # the exporter retries: nothing changes
    assert list(Span.objects.filter(run=run).order_by("id").values()) == before
    assert Run.objects.filter(id=run.id).values(*usage).get() == usage
    assert Task.objects.filter(run=run).count() == 1


def tree_of(nodes) -> dict:
    """The API's span tree as {name: [children's names]}, every level."""
    found = {}
    for node in nodes:
        found[node["name"]] = [child["name"] for child in node["children"]]
        found.update(tree_of(node["children"]))
    return found


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_children_that_arrive_before_their_parent_are_attached_when_it_does(people, client, priced, encoding):  # noqa: F811
    """The batch ends between the children and their parent, which names another agent (another task)."""
    agent, _ = people
    spans = sdk_spans(agent_name="triage")
    assert send(client, agent, [spans["chat summarise"], spans["execute_tool lookup"], spans["chat plan"]],
                encoding).status_code == 200  # fmt: skip
    run = Run.objects.get(otlp_traces__isnull=False)
    waiting = shape(run)
    assert waiting == {
        name: ("task support-agent", "parent not received") for name in ("execute_tool lookup", "chat plan")
    } | {"chat summarise": ("execute_tool lookup", "")}
    client.force_login(run.started_by)
    assert "parent not received" in row(client.get(f"/runs/{run.id}/").content.decode(), span_named(run, "chat plan"))

    assert send(client, agent, [spans["invoke_agent support-agent"]], encoding).status_code == 200
    assert shape(run) == TREE | {"invoke_agent support-agent": ("task triage", "")}
    # The children moved to their parent's task, their usage with them.
    tasks = dict(Task.objects.filter(run=run).values_list("key", "tokens_used"))
    assert tasks == {"support-agent": 0, "triage": 550}
    assert set(
        Span.objects.filter(run=run, attributes__otlp_name__isnull=False).values_list("task__key", flat=True)
    ) == {"triage"}
    # The API's tree and the trace page's subtree totals follow the deeper tree, older children included.
    trace = tree_of(call(client, agent, f"/api/v1/runs/{run.id}/trace").json())
    assert trace["gpt-test"] == [] and sorted(trace["invoke_agent support-agent"]) == [
        "execute_tool lookup",
        "gpt-test",
    ]
    assert trace["execute_tool lookup"] == ["gpt-test"]
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert "Σ 550 tok" in row(page, span_named(run, "invoke_agent support-agent"))
    assert "Σ 50 tok" in row(page, span_named(run, "execute_tool lookup"))
    assert "parent not received" not in page
    assert send(client, agent, list(spans.values()), encoding).status_code == 200  # all again: nothing changes
    assert shape(run) == TREE | {"invoke_agent support-agent": ("task triage", "")}
    assert Run.objects.get(id=run.id).tokens_used == 550


def test_a_parent_that_arrives_between_an_older_grandparent_and_its_child_totals_the_whole_subtree(
    people,  # noqa: F811
    client,
    priced,
):
    """Rows in the order grandparent, grandchild, parent: the trace page sums from the leaves up, not by id."""
    agent, _ = people
    spans = sdk_spans()
    assert (
        send(client, agent, [spans["invoke_agent support-agent"], spans["chat summarise"]], "protobuf").status_code
        == 200
    )
    assert send(client, agent, [spans["execute_tool lookup"]], "protobuf").status_code == 200
    run = Run.objects.get(otlp_traces__isnull=False)
    assert shape(run)["chat summarise"] == ("execute_tool lookup", "")
    client.force_login(run.started_by)
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert "Σ 50 tok" in row(page, span_named(run, "invoke_agent support-agent"))
    assert "3 spans" in row(page, span_named(run, "invoke_agent support-agent"))


def test_a_span_whose_parent_never_arrives_hangs_under_its_task_marked(people, client, priced):  # noqa: F811
    agent, _ = people
    spans = sdk_spans()
    assert send(client, agent, [spans["chat plan"]], "protobuf").status_code == 200
    run = Run.objects.get(otlp_traces__isnull=False)
    orphan = span_named(run, "chat plan")
    assert orphan.parent.kind == "task" and orphan.attributes["otlp_orphan"] == "parent not received"
    assert orphan.attributes["otlp_parent_span_id"] == format(spans["chat plan"].parent.span_id, "016x")
    client.force_login(run.started_by)
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert "parent not received" in row(page, orphan)
    assert Run.objects.get(id=run.id).tokens_used == 500  # its usage counts all the same


def test_a_push_after_a_parent_arrives_sends_the_page_back_to_the_database(people, client, priced):  # noqa: F811
    """A push only adds and updates nodes: a span moved under its late parent needs the page re-read."""
    agent, _ = people
    spans = sdk_spans()
    assert send(client, agent, [spans["chat plan"]], "protobuf").status_code == 200
    run = Run.objects.get(otlp_traces__isnull=False)
    assert run_push(run.id) == {"refetch": True}  # the watermark
    assert send(client, agent, [spans["execute_tool lookup"]], "protobuf").status_code == 200
    assert "refetch" not in run_push(run.id)  # a new span: pushed as usual
    assert send(client, agent, [spans["invoke_agent support-agent"]], "protobuf").status_code == 200
    assert run_push(run.id) == {"refetch": True}


def test_a_push_carries_the_whole_subtrees_totals_of_a_deeper_ingested_tree(people, client, priced):  # noqa: F811
    """A push loads only the new span and its ancestors: an agent span's Σ must still be its whole subtree's."""
    agent, _ = people
    spans = sdk_spans()
    assert send(client, agent, [spans["invoke_agent support-agent"], spans["chat plan"]], "protobuf").status_code == 200
    run = Run.objects.get(otlp_traces__isnull=False)
    assert run_push(run.id) == {"refetch": True}  # the watermark
    assert send(client, agent, [spans["execute_tool lookup"], spans["chat summarise"]], "protobuf").status_code == 200
    pushed = run_push(run.id)["html"]
    client.force_login(run.started_by)
    page = client.get(f"/runs/{run.id}/").content.decode()
    for name in ("invoke_agent support-agent", "execute_tool lookup"):
        node = span_named(run, name)
        assert re.search(r"Σ[^<]*", row(pushed, node)).group(0) == re.search(r"Σ[^<]*", row(page, node)).group(0)
    assert "Σ 550 tok" in row(pushed, span_named(run, "invoke_agent support-agent"))


def span_named(run, otlp_name: str) -> Span:
    return Span.objects.get(run=run, attributes__otlp_name=otlp_name)


# --- malformed bodies: 400 with what is wrong, nothing written ---------------------------------------------------
def js(document) -> bytes:
    return json.dumps(document).encode()


def one_span(**fields) -> bytes:
    span = {"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "0000000000000001", "name": "x",
            "startTimeUnixNano": "1764000000000000000", "endTimeUnixNano": "1764000000500000000", **fields}  # fmt: skip
    return js({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})


GOOD = export(span(1, "x"), span(2, "y")).SerializeToString()
MALFORMED_JSON = [
    (js({"resourceSpans": {"scopeSpans": []}}), "resourceSpans must be a list, not an object"),
    (js({"resourceSpans": ["a", "b"]}), "resourceSpans[0] must be an object, not a string"),
    (js({"resourceSpans": [{"scopeSpans": "spans"}]}), "resourceSpans[0].scopeSpans must be a list, not a string"),
    (js({"resourceSpans": [{"scopeSpans": [7]}]}), "resourceSpans[0].scopeSpans[0] must be an object, not a number"),
    (js({"resourceSpans": [{"scopeSpans": [{"spans": "x"}]}]}), "scopeSpans[0].spans must be a list, not a string"),
    (js({"resourceSpans": [{"scopeSpans": [{"spans": [None]}]}]}), "spans[0] must be an object, not null"),
    (js({"resourceSpans": [{"resource": ["a"], "scopeSpans": []}]}), "resourceSpans[0].resource must be an object"),
    (js({"resourceSpans": [{"scopeSpans": [{"scope": "s", "spans": []}]}]}), "scopeSpans[0].scope must be an object"),
    (js([{"resourceSpans": []}]), "an OTLP/JSON export is an object with resourceSpans, not a list"),
    (js("resourceSpans"), "not a string"),
    (one_span(traceId=12), "spans[0].traceId must be a hex string, not a number"),
    (one_span(traceId="zz" * 16), "spans[0].traceId 'zzzz"),
    (one_span(traceId="5b8e"), "spans[0].traceId: 32 hex digits expected, got 4"),
    (one_span(spanId=None), "spans[0].spanId must be a hex string, not null"),
    (one_span(spanId="00000000000000"), "spans[0].spanId: 16 hex digits expected"),
    (one_span(spanId="0000000000000000"), "an id of zeros"),
    (one_span(parentSpanId="xyz"), "spans[0].parentSpanId 'xyz' is not hex"),
    (one_span(parentSpanId=["00"]), "spans[0].parentSpanId must be a hex string, not a list"),
    (one_span(parentSpanId="0000000000000001"), "is its own ancestor"),
    (one_span(startTimeUnixNano="yesterday"), "startTimeUnixNano: invalid literal"),
    (one_span(startTimeUnixNano="-5"), "startTimeUnixNano: Value out of range"),
    (one_span(startTimeUnixNano=None), "has no startTimeUnixNano"),
    (one_span(endTimeUnixNano="1"), "ends before it starts"),
    (one_span(endTimeUnixNano=1e300), "endTimeUnixNano"),
    (one_span(name=5), "name: expected string"),
    (one_span(attributes="a=b"), "spans[0].attributes must be a list, not a string"),
    (one_span(attributes=[{"key": 1, "value": {}}]), "attributes.key"),
    (one_span(attributes=[5]), "attributes"),
    (one_span(status="ok"), "spans[0].status must be an object, not a string"),
    (one_span(status={"message": 3}), "status.message: expected string"),
    (one_span(attributes=["ab"]), "spans[0].attributes[0] must be an object, not a string"),
    (one_span(attributes=[{"key": "k", "value": "v"}]), "attributes[0].value must be an object, not a string"),
    (one_span(events=[{"name": "e", "attributes": "x"}]), "spans[0].events[0].attributes must be a list"),
    (one_span(links="l"), "spans[0].links must be a list, not a string"),
    (js({"resourceSpans": [{"resource": {"attributes": [3]}}]}), "resourceSpans[0].resource.attributes[0] must be"),
    (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "\xff\xfe"}]}]}]}', "not UTF-8"),
    (b'{"resourceSpans": [', "not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
]
MALFORMED_PROTOBUF = [
    (GOOD[: len(GOOD) // 2], "not an OTLP trace export (protobuf)"),
    (GOOD[:-3], "not an OTLP trace export (protobuf)"),
    (GOOD.replace(b"*\x01y", b"*\x01\xff"), "not an OTLP trace export (protobuf)"),  # a name not UTF-8
    (b"\x0a\xff\xff\xff\xff\x0f", "not an OTLP trace export (protobuf)"),
    (export(span(1, "x", trace=bytes(16))).SerializeToString(), "an id of zeros"),
    (
        export(
            OtlpSpan(trace_id=TRACE, span_id=b"\x01" * 8, name="x", start_time_unix_nano=T0, parent_span_id=b"\x02" * 3)
        ).SerializeToString(),
        "a parent span id is 8 bytes",
    ),  # fmt: skip
    (export(OtlpSpan(trace_id=TRACE, span_id=b"\x01" * 8, name="x")).SerializeToString(), "has no startTimeUnixNano"),
    (
        export(
            OtlpSpan(
                trace_id=TRACE, span_id=b"\x01" * 8, name="a", start_time_unix_nano=T0, parent_span_id=b"\x02" * 8
            ),
            OtlpSpan(
                trace_id=TRACE, span_id=b"\x02" * 8, name="b", start_time_unix_nano=T0, parent_span_id=b"\x01" * 8
            ),
        ).SerializeToString(),
        "is its own ancestor",
    ),  # fmt: skip
]
MALFORMED = [(b, "application/json", r) for b, r in MALFORMED_JSON] + [
    (b, "application/x-protobuf", r) for b, r in MALFORMED_PROTOBUF
]


@pytest.mark.parametrize("body,content_type,reason", MALFORMED, ids=[f"{c[12:16]}-{r[:30]}" for _, c, r in MALFORMED])
def test_a_malformed_body_is_a_400_naming_what_is_wrong_and_writes_nothing(people, client, body, content_type, reason):  # noqa: F811
    agent, _ = people
    answer = post(client, agent, body, content_type)
    assert answer.status_code == 400, answer.content[:300]
    assert answer.json()["code"] == "invalid_input" and reason in answer.json()["message"], answer.json()
    assert not Run.objects.exists() and not Span.objects.exists() and not Task.objects.exists()


def test_nul_characters_and_absurd_numbers_are_stored_without_an_error(people, client):  # noqa: F811
    """PostgreSQL's text refuses NUL and its integer columns overflow: a valid export still goes in."""
    agent, _ = people
    body = export(span(1, "chat\x00x", gen_ai__operation__name="chat", gen_ai__request__model="m\x00",
                       gen_ai__usage__input_tokens=10**15, weird__key="a\x00b")).SerializeToString()  # fmt: skip
    assert post(client, agent, body).status_code == 200
    stored = Span.objects.get(attributes__otlp_span_id=(1).to_bytes(8, "big").hex())
    assert stored.name == "m" and stored.attributes["otlp_name"] == "chatx" and stored.tokens_in == 2_000_000_000


def _paths(value, path=()):
    """Every level of a JSON document: each object and list, and each member of a span."""
    if isinstance(value, dict | list) or (len(path) >= 3 and path[-3] == "spans"):
        yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*path, i))


def _replaced(document, path, value):
    if not path:
        return value
    copy = json.loads(json.dumps(document))
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return copy


SDK_JSON = b""  # the SDK's trace as OTLP/JSON, made once for every example


def _sdk_json() -> bytes:
    global SDK_JSON
    SDK_JSON = otlp_json(list(sdk_spans().values()))
    return SDK_JSON


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_value_anywhere_in_an_otlp_json_body_is_taken_or_refused_with_a_400(people, client, data):  # noqa: F811
    """Fuzz: one member of a real export replaced by any JSON value; never a 500, and a 400 writes nothing."""
    agent, _ = people
    document = json.loads(SDK_JSON or _sdk_json())
    path = data.draw(st.sampled_from(list(_paths(document))))
    body = js(_replaced(document, path, data.draw(JSON_VALUES)))
    before = (Run.objects.count(), Span.objects.count(), Task.objects.count())
    answer = post(client, agent, body, "application/json")
    assert answer.status_code in (200, 400), (path, answer.content[:300])
    if answer.status_code == 400:
        assert answer.json()["message"], path
        assert (Run.objects.count(), Span.objects.count(), Task.objects.count()) == before
