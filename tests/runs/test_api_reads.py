"""The integration API's reads: tasks, the trace as a tree and as OTLP/JSON, artifacts, audit, the
registry and insight — each limited to the caller's projects."""

import base64
import copy
import json

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from runs.models import Run, Span
from runs.services import run_start
from tenancy.models import Project
from tenancy.tokens import api_token_create
from tests.conftest import wait_for


def bearer(token: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


@pytest.fixture
def finished(demo_tx, operator, worker):
    run = run_start(workflow="deploy-review", started_by=operator)
    wait_for(lambda: Run.objects.get(id=run.id).status == Run.Status.COMPLETED, timeout=60, message="the run")
    return run


def otlp_parse(document: dict) -> ExportTraceServiceRequest:
    """OTLP/JSON differs from protobuf's JSON mapping in one way: trace and span ids are hex, not base64."""
    document = copy.deepcopy(document)
    for resource in document["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                for field in ("traceId", "spanId", "parentSpanId"):
                    if field in span:
                        span[field] = base64.b64encode(bytes.fromhex(span[field])).decode()
    return json_format.ParseDict(document, ExportTraceServiceRequest())  # unknown fields are errors


def test_the_trace_exports_as_valid_otlp_with_genai_attributes(finished, operator, client):
    token = api_token_create(user=operator)[1]
    document = client.get(f"/api/v1/runs/{finished.id}/trace/otlp", **bearer(token)).json()
    request = otlp_parse(document)
    spans = request.resource_spans[0].scope_spans[0].spans
    assert len(spans) == Span.objects.filter(run=finished).count()
    assert len({s.trace_id for s in spans}) == 1
    ids = {s.span_id for s in spans}
    assert all(s.parent_span_id in ids for s in spans if s.parent_span_id)  # a closed tree
    attributes = [{a.key: a.value for a in s.attributes} for s in spans]

    def operation(a):
        return a["gen_ai.operation.name"].string_value if "gen_ai.operation.name" in a else ""

    chats = [a for a in attributes if operation(a) == "chat"]
    assert len(chats) == Span.objects.filter(run=finished, kind="model_call").count()
    used = sum(a["gen_ai.usage.input_tokens"].int_value + a["gen_ai.usage.output_tokens"].int_value for a in chats)
    assert used == Run.objects.get(id=finished.id).tokens_used > 0
    tools = [a for a in attributes if "gen_ai.tool.name" in a]
    assert [t["gen_ai.tool.name"].string_value for t in tools] == ["deployments.read"]
    assert all(s.end_time_unix_nano >= s.start_time_unix_nano > 0 for s in spans)


def test_tree_tasks_artifacts_and_audit(finished, operator, client):
    token = api_token_create(user=operator)[1]
    tree = client.get(f"/api/v1/runs/{finished.id}/trace", **bearer(token)).json()
    assert [node["kind"] for node in tree] == ["run"]
    keys = {child["name"] for child in tree[0]["children"] if child["kind"] == "task"}
    assert {"task inventory", "task risk", "task verify"} <= keys or len(keys) == 3

    tasks = client.get(f"/api/v1/runs/{finished.id}/tasks", **bearer(token)).json()
    risk = next(t for t in tasks if t["key"] == "risk")
    assert risk["attempts"] == 2 and risk["status"] == "completed" and risk["tokens"] > 0

    artifacts = client.get(f"/api/v1/runs/{finished.id}/artifacts", **bearer(token)).json()
    verdict = next(a for a in artifacts if a["key"] == "verify")
    assert "APPROVE" in json.dumps(verdict["content"]) and verdict["provenance"]["task"] == "verify"

    client.get(f"/api/v1/runs/{finished.id}/trace", **bearer(api_token_create(user=operator, scopes=["run"])[1]))
    audit = client.get("/api/v1/audit?action=denied:view", **bearer(token)).json()
    assert [(e["outcome"], e["target"], e["project"]) for e in audit["items"]] == [
        ("denied", f"run {finished.id}", "default")  # the token without the read scope
    ]


def test_reads_stay_inside_my_projects(finished, operator, client, django_user_model):
    from tenancy.access import membership_grant

    stranger = django_user_model.objects.create_user(username="sam", password="x")
    membership_grant(user=stranger, project=Project.objects.create(slug="other", name="Other"), role="admin")
    token = api_token_create(user=stranger)[1]
    for path in ("tasks", "trace", "trace/otlp", "artifacts"):
        response = client.get(f"/api/v1/runs/{finished.id}/{path}", **bearer(token))
        assert response.status_code == 404 and set(response.json()) == {"code", "message", "errors"}
    assert client.get(f"/api/v1/audit?run={finished.id}", **bearer(token)).json()["items"] == []
    assert client.get("/api/v1/insight", **bearer(token)).json()["total"]["runs"] == 0
    mine = client.get("/api/v1/insight", **bearer(api_token_create(user=operator)[1])).json()
    assert mine["total"]["runs"] == 1 and mine["total"]["completed"] == 1
    shared = {w["slug"] for w in client.get("/api/v1/workflows", **bearer(token)).json()}
    assert "deploy-review" in shared  # the demo workflows are shared by every project
    assert {a["slug"] for a in client.get("/api/v1/agents", **bearer(token)).json()} >= {"risk-agent"}
