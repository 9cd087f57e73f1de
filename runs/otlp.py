"""A run's trace as OpenTelemetry spans (OTLP/JSON), with the GenAI semantic conventions.

One trace per run: the trace id is derived from the run (stable across exports), span ids from span
ids. Model calls are ``chat`` operations, tool calls ``execute_tool``, tasks ``invoke_agent``; tokens
go to ``gen_ai.usage.*``. Bodies (prompts, results) are not exported: they stay behind the API's
payload endpoint, redacted as journaled.
"""

import hashlib

from .models import Run, Span

SCOPE = {"name": "warden", "version": "1"}
STATUS_CODE = {"ok": 1, "error": 2, "quarantined": 2}  # STATUS_CODE_OK, STATUS_CODE_ERROR
KIND_INTERNAL, KIND_CLIENT = 1, 3
OPERATION = {"model_call": "chat", "tool_call": "execute_tool", "task": "invoke_agent", "attempt": "invoke_agent"}


def trace_id(run_id: int) -> str:
    return hashlib.sha256(f"warden-run-{run_id}".encode()).hexdigest()[:32]


def span_id(span_id: int) -> str:
    return f"{span_id:016x}"


def _nanos(moment) -> str:
    return str(int(moment.timestamp() * 1_000_000) * 1000)


def otlp_attribute(key: str, value) -> dict:
    """One OTLP/JSON attribute, typed by the value."""
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}  # int64 travels as a string in OTLP/JSON
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": str(value)}}


def _span(span: dict, run: Run, agents: dict[int, str], models: dict[int, str]) -> dict:
    kind = span["kind"]
    attributes = [
        ("warden.span.kind", kind),
        ("warden.run.id", run.id),
    ]
    if kind in OPERATION:
        attributes.append(("gen_ai.operation.name", OPERATION[kind]))
    if span["task_id"] in agents:
        attributes.append(("gen_ai.agent.name", agents[span["task_id"]]))
    if span["step"] is not None:
        attributes.append(("warden.step", span["step"]))
    if span["attempt"] is not None:
        attributes.append(("warden.attempt", span["attempt"]))
    if kind == Span.Kind.MODEL_CALL:
        attributes += [
            ("gen_ai.request.model", span["name"]),
            ("gen_ai.response.model", span["name"]),
            ("gen_ai.usage.input_tokens", span["tokens_in"]),
            ("gen_ai.usage.output_tokens", span["tokens_out"]),
            ("warden.cost_usd", span["cost_micros"] / 1_000_000),
        ]
        if span["task_id"] in models:
            attributes.append(("gen_ai.system", models[span["task_id"]]))
    if kind == Span.Kind.TOOL_CALL:
        attributes.append(("gen_ai.tool.name", span["name"]))
    name = f"{OPERATION[kind]} {span['name']}" if kind in OPERATION else span["name"]
    out = {
        "traceId": trace_id(run.id),
        "spanId": span_id(span["id"]),
        "name": name[:200],
        "kind": KIND_CLIENT if kind in ("model_call", "tool_call") else KIND_INTERNAL,
        "startTimeUnixNano": _nanos(span["started_at"]),
        "endTimeUnixNano": _nanos(span["ended_at"] or span["started_at"]),
        "attributes": [otlp_attribute(k, v) for k, v in attributes],
        "status": {"code": STATUS_CODE.get(span["status"], 0)},
    }
    if span["parent_id"]:
        out["parentSpanId"] = span_id(span["parent_id"])
    return out


def run_otlp(run: Run) -> dict:
    """An ExportTraceServiceRequest in OTLP/JSON (ids in hex, as the OTLP/JSON encoding specifies)."""
    fields = ("id", "parent_id", "task_id", "kind", "name", "status", "attempt", "step", "started_at", "ended_at")
    spans = list(Span.objects.filter(run=run).order_by("id").values(*fields, "tokens_in", "tokens_out", "cost_micros"))
    tasks = run.tasks.select_related("agent").only("id", "agent__slug", "agent__provider")
    agents = {t.id: t.agent.slug for t in tasks}
    models = {t.id: t.agent.provider for t in tasks}
    resource = {
        "attributes": [
            otlp_attribute("service.name", "warden"),
            otlp_attribute("warden.project", run.project.slug),
            otlp_attribute("warden.workflow", run.workflow.slug),
        ]
    }
    return {
        "resourceSpans": [
            {
                "resource": resource,
                "scopeSpans": [{"scope": SCOPE, "spans": [_span(s, run, agents, models) for s in spans]}],
            }
        ]
    }
