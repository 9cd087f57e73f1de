"""OTLP ingest: spans from any OpenTelemetry-instrumented agent become a Warden run's trace (docs/integrations.md,
"OpenTelemetry").

A request (OTLP/HTTP, protobuf or JSON) is parsed whole and checked before anything is written; then,
in one transaction, each span goes to a run: the one its ``warden.run.id`` attribute (on the span or its
resource) names, else the run of its trace (a new external run the first time a trace is seen). Spans
are grouped into tasks by the agent that made them (``gen_ai.agent.name``, else the resource's
``service.name``). A span with GenAI usage (``gen_ai.usage.input_tokens`` / ``output_tokens``) or a chat
operation is a model call, priced by the price table for the provider that answered
(``gen_ai.provider.name``, formerly ``gen_ai.system``); ``execute_tool`` is a tool call; anything else a
step of the agent's plan. A span sent twice (exporters retry) is kept once. Usage counts against the
run's budget as any external report does.
"""

import base64
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import transaction
from django.utils.text import slugify
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from agents.gateway import cost_micros
from agents.models import Workflow
from agents.selectors import workflow_visible
from core import bus
from core.errors import InvalidInput, NotFound
from tenancy.access import authorize, default_project
from tenancy.models import Project

from .external import budget_breach, budget_stop, external_task_open
from .models import OtlpTrace, Run, Span
from .services import sql
from .services.runs import run_start

MODEL_OPERATIONS = {"chat", "text_completion", "generate_content", "embeddings"}
STATUS_ERROR = 2
RUN_ATTRIBUTE = "warden.run.id"


class OtlpInvalid(InvalidInput):
    """A payload that is not an OTLP trace export: 400 with the reason, nothing written."""


@dataclass
class OtlpSpan:
    trace_id: str
    span_id: str
    name: str
    started: datetime
    ended: datetime
    error: bool
    attributes: dict = field(default_factory=dict)
    resource: dict = field(default_factory=dict)

    def attribute(self, *names, default=None):
        for name in names:
            for source in (self.attributes, self.resource):
                if source.get(name) not in (None, ""):
                    return source[name]
        return default


def _value(any_value):
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    value = getattr(any_value, kind)
    if kind == "array_value":
        return [_value(v) for v in value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.values}
    if kind == "bytes_value":
        return value.hex()
    return value


def _attributes(pairs) -> dict:
    return {kv.key[:200]: _value(kv.value) for kv in pairs}


def _moment(nanos: int) -> datetime:
    return datetime.fromtimestamp(nanos / 1e9, tz=UTC)


def _hex_ids_to_base64(document) -> None:
    """OTLP/JSON writes trace and span ids in hex; protobuf's JSON reader expects base64 for bytes."""
    for resource_spans in document.get("resourceSpans") or []:
        for scope_spans in resource_spans.get("scopeSpans") or []:
            for span in scope_spans.get("spans") or []:
                for name in ("traceId", "spanId", "parentSpanId"):
                    if span.get(name):
                        try:
                            span[name] = base64.b64encode(bytes.fromhex(span[name])).decode()
                        except (ValueError, TypeError) as exc:
                            raise OtlpInvalid(f"{name} {span[name]!r} is not hex") from exc


def otlp_parse(body: bytes, content_type: str, *, max_spans: int) -> list[OtlpSpan]:
    """The spans of an ExportTraceServiceRequest, or OtlpInvalid with the reason."""
    message = ExportTraceServiceRequest()
    try:
        if content_type.startswith("application/json"):
            document = json.loads(body or b"{}")
            if not isinstance(document, dict):
                raise OtlpInvalid("an OTLP/JSON export is an object with resourceSpans")
            _hex_ids_to_base64(document)
            json_format.ParseDict(document, message, ignore_unknown_fields=True)
        elif content_type.startswith("application/x-protobuf"):
            message.ParseFromString(body)
        else:
            raise OtlpInvalid("Content-Type must be application/x-protobuf or application/json")
    except (ValueError, DecodeError, json_format.ParseError) as exc:
        raise OtlpInvalid(f"not an OTLP trace export: {str(exc)[:200]}") from exc
    spans = []
    for resource_spans in message.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                if len(span.trace_id) != 16 or len(span.span_id) != 8:
                    raise OtlpInvalid(f"span {span.name[:60]!r}: a trace id is 16 bytes and a span id 8")
                if span.end_time_unix_nano and span.end_time_unix_nano < span.start_time_unix_nano:
                    raise OtlpInvalid(f"span {span.name[:60]!r} ends before it starts")
                spans.append(
                    OtlpSpan(
                        trace_id=span.trace_id.hex(), span_id=span.span_id.hex(), name=span.name[:200] or "span",
                        started=_moment(span.start_time_unix_nano),
                        ended=_moment(span.end_time_unix_nano or span.start_time_unix_nano),
                        error=span.status.code == STATUS_ERROR, attributes=_attributes(span.attributes),
                        resource=resource,
                    )
                )  # fmt: skip
                if len(spans) > max_spans:
                    raise OtlpInvalid(f"more than {max_spans} spans in one request")
    return spans


# --- where each span goes ----------------------------------------------------------------------------


def _named_run(span: OtlpSpan, user, token, request) -> Run | None:
    ref = span.attribute(RUN_ATTRIBUTE)
    if ref is None:
        return None
    try:
        run_id = int(ref)
    except (TypeError, ValueError) as exc:
        raise OtlpInvalid(f"{RUN_ATTRIBUTE} {ref!r} is not a run id") from exc
    run = Run.objects.select_related("workflow").filter(id=run_id).first()
    if run is None:
        raise NotFound(f"run {run_id} does not exist")
    authorize(user, run.project_id, "start", what=f"run {run_id}", token=token, request=request)
    if run.workflow.planner != Workflow.Planner.EXTERNAL:
        raise OtlpInvalid(f"run {run_id} is run by Warden's own workers; spans go to an external run")
    return run


def _trace_run(span: OtlpSpan, user, token, request, default_workflow: str) -> Run:
    """The run of this trace: found, or started (an external run) the first time the trace is seen."""
    slug = str(span.attribute("warden.workflow", default=default_workflow))
    workflow = workflow_visible(slug=slug, user=user)  # another project's answers as a missing one
    if workflow is None or workflow.planner != Workflow.Planner.EXTERNAL:
        raise OtlpInvalid(f"no external workflow {slug!r} to start a run of this trace in (warden.workflow)")
    project_slug = span.attribute("warden.project")
    project = (
        Project.objects.filter(slug=str(project_slug)).first()
        if project_slug
        else workflow.project or default_project()
    )
    if project is None:
        raise NotFound(f"project {project_slug} does not exist")
    authorize(user, project.id, "start", what=f"project {project.slug}", token=token, request=request)
    known = OtlpTrace.objects.filter(project=project, trace_id=span.trace_id).select_related("run").first()
    if known is not None:
        return known.run
    run = run_start(workflow=slug, goal=span.name, started_by=user, project=project, via="otlp", request=request)
    OtlpTrace.objects.create(project=project, trace_id=span.trace_id, run=run)
    return run


def _kind(span: OtlpSpan) -> str:
    operation = str(span.attribute("gen_ai.operation.name", default=""))
    if operation in MODEL_OPERATIONS or span.attribute("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"):
        return Span.Kind.MODEL_CALL
    if operation == "execute_tool" or span.attribute("gen_ai.tool.name"):
        return Span.Kind.TOOL_CALL
    return Span.Kind.PLAN


def _int(value) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def _task(run: Run, span: OtlpSpan, tasks: dict) -> tuple:
    """The span's task and the task's span, opened once per agent of the request."""
    agent = str(span.attribute("gen_ai.agent.name", "service.name", default="agent"))[:200]
    if (run.id, agent) not in tasks:
        task = external_task_open(run_id=run.id, key=(slugify(agent) or "agent")[:64], agent=agent)
        parent = Span.objects.filter(task=task, kind=Span.Kind.TASK).values_list("id", flat=True).first()
        tasks[(run.id, agent)] = (task, parent)
    return tasks[(run.id, agent)]


def _record(run: Run, span: OtlpSpan, tasks: dict) -> bool:
    """The span under its task, with its usage; False when it was recorded already."""
    if Span.objects.filter(run=run, attributes__otlp_span_id=span.span_id).exists():
        return False
    task, parent = _task(run, span, tasks)
    kind = _kind(span)
    tokens_in = _int(span.attribute("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"))
    tokens_out = _int(span.attribute("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens"))
    provider = str(span.attribute("gen_ai.provider.name", "gen_ai.system", default=""))[:32]
    model = str(span.attribute("gen_ai.response.model", "gen_ai.request.model", default=""))[:100]
    cost = cost_micros(provider, model, tokens_in, tokens_out) if kind == Span.Kind.MODEL_CALL and model else 0
    shown = {
        k: v
        for k, v in span.attributes.items()
        if k.startswith(("gen_ai.", "warden.")) and not isinstance(v, dict | list)
    }
    Span.objects.create(
        run=run, task=task, parent_id=parent, kind=kind,
        name=(model if kind == Span.Kind.MODEL_CALL and model else span.name)[:200],
        status=Span.Status.ERROR if span.error else Span.Status.OK, started_at=span.started, ended_at=span.ended,
        tokens_in=tokens_in, tokens_out=tokens_out, cost_micros=cost,
        attributes={"external": True, "otlp_trace_id": span.trace_id, "otlp_span_id": span.span_id,
                    "otlp_name": span.name, "provider": provider, **dict(list(shown.items())[:40])},
    )  # fmt: skip
    usage = {"steps": 1, "tokens": tokens_in + tokens_out, "tool_calls": int(kind == Span.Kind.TOOL_CALL), "cost": cost}
    sql.add_usage("runs_task", task.id, **usage)
    sql.add_usage("runs_run", run.id, **usage)
    return True


def otlp_ingest(*, spans: list[OtlpSpan], user, token, request=None, default_workflow: str) -> dict:
    """Write the spans (all of them, or none): which runs they went to and how many were new."""
    runs: dict[int, Run] = {}
    found: dict[tuple, Run] = {}  # by what names the run: each is looked up (and authorised) once
    tasks: dict = {}
    recorded = 0
    with transaction.atomic():
        for span in spans:
            names = (span.attribute(RUN_ATTRIBUTE), span.trace_id, span.attribute("warden.workflow"),
                     span.attribute("warden.project"))  # fmt: skip
            if names not in found:
                found[names] = _named_run(span, user, token, request) or _trace_run(
                    span, user, token, request, default_workflow
                )
            run = runs.setdefault(found[names].id, found[names])
            if run.status != Run.Status.RUNNING:
                continue  # a finished run's trace keeps what it had; late spans are not counted
            recorded += _record(run, span, tasks)
        for run in runs.values():
            run.refresh_from_db()
            why = budget_breach(run) if run.status == Run.Status.RUNNING else ""
            if why:
                budget_stop(run, why)
    for run_id in runs:
        bus.run_changed(run_id)
    return {"runs": sorted(runs), "spans": recorded}
