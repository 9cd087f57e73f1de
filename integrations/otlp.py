"""A run's trace as OpenTelemetry spans, through the OpenTelemetry SDK: the per-run download
(OTLP/JSON) and, with OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) set, a live
export of every span soon after it closes, by the SDK's OTLP/HTTP exporter (its other OTEL_EXPORTER_OTLP_*
settings, headers included, apply).

One trace per run: the trace id is derived from the run (stable across exports), span ids from span
ids, so a span exported live and again in a download is the same span. GenAI semantic conventions:
model calls are ``chat`` operations with the provider that answered (``gen_ai.provider.name``, and the
older ``gen_ai.system``), the model and the tokens; tool calls ``execute_tool``; tasks and attempts
``invoke_agent``. Bodies (prompts, results) are not exported: they stay behind the API's payload
endpoint, redacted as journaled.
"""

import base64
import hashlib
import logging
import os
import threading
from datetime import UTC, datetime, timedelta

from django.db import connection, connections, transaction
from django.utils import timezone
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from runs.models import Run, Span, Task

from .models import OtlpExportCursor

log = logging.getLogger("warden.otlp")
SCOPE = InstrumentationScope("warden", "1")
STATUS = {"ok": StatusCode.OK, "error": StatusCode.ERROR, "quarantined": StatusCode.ERROR}
OPERATION = {"model_call": "chat", "tool_call": "execute_tool", "task": "invoke_agent", "attempt": "invoke_agent"}
FIELDS = ("id", "run_id", "parent_id", "task_id", "kind", "name", "status", "attempt", "step", "started_at",
          "ended_at", "tokens_in", "tokens_out", "cost_micros", "body")  # fmt: skip
EXPORT_BATCH = 512
EXPORT_LAG = timedelta(seconds=2)  # spans that closed this long ago: workers' clocks differ a little
EXPORT_HOLD = timedelta(minutes=5)  # the longest an open transaction holds the export back (a forgotten psql)


def trace_id(run_id: int) -> str:
    return hashlib.sha256(f"warden-run-{run_id}".encode()).hexdigest()[:32]


def span_id(span_id: int) -> str:
    return f"{span_id:016x}"


def _context(run_id: int, span: int) -> SpanContext:
    return SpanContext(int(trace_id(run_id), 16), span, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def _nanos(moment) -> int:
    return int(moment.timestamp() * 1_000_000) * 1000


class _Runs:
    """What the spans of some runs need from their runs and tasks: the resource, agents and providers."""

    def __init__(self, run_ids: set[int]):
        runs = Run.objects.filter(id__in=run_ids).select_related("project", "workflow")
        self.resources = {
            r.id: Resource({"service.name": "warden", "warden.project": r.project.slug,
                            "warden.workflow": r.workflow.slug if r.workflow_id else ""})
            for r in runs
        }  # fmt: skip
        tasks = Task.objects.filter(run_id__in=run_ids).values_list("id", "agent__slug", "agent__provider")
        self.agents = {task: slug for task, slug, _ in tasks}
        self.providers = {task: provider for task, _, provider in tasks}


def _attributes(span: dict, runs: _Runs) -> dict:
    kind = span["kind"]
    attributes = {"warden.span.kind": kind, "warden.run.id": span["run_id"]}
    if kind in OPERATION:
        attributes["gen_ai.operation.name"] = OPERATION[kind]
    if span["task_id"] in runs.agents:
        attributes["gen_ai.agent.name"] = runs.agents[span["task_id"]]
    for name in ("step", "attempt"):
        if span[name] is not None:
            attributes[f"warden.{name}"] = span[name]
    if kind == Span.Kind.MODEL_CALL:
        body = span["body"] if isinstance(span["body"], dict) else {}
        # The provider that answered (a routing rule or a fallback may have chosen another than the agent's).
        provider = body.get("provider") or runs.providers.get(span["task_id"], "")
        attributes.update({
            "gen_ai.request.model": span["name"], "gen_ai.response.model": span["name"],
            "gen_ai.usage.input_tokens": span["tokens_in"], "gen_ai.usage.output_tokens": span["tokens_out"],
            "warden.cost_usd": span["cost_micros"] / 1_000_000,
            "gen_ai.provider.name": provider, "gen_ai.system": provider,
        })  # fmt: skip
    if kind == Span.Kind.TOOL_CALL:
        attributes["gen_ai.tool.name"] = span["name"]
    return attributes


def readable_spans(spans: list[dict], runs: _Runs | None = None) -> list[ReadableSpan]:
    """Warden's spans as the SDK's: what its exporters and encoders take."""
    runs = runs or _Runs({s["run_id"] for s in spans})
    out = []
    for span in spans:
        kind = span["kind"]
        name = f"{OPERATION[kind]} {span['name']}" if kind in OPERATION else span["name"]
        out.append(
            ReadableSpan(
                name=name[:200],
                context=_context(span["run_id"], span["id"]),
                parent=_context(span["run_id"], span["parent_id"]) if span["parent_id"] else None,
                resource=runs.resources.get(span["run_id"], Resource({"service.name": "warden"})),
                attributes=_attributes(span, runs),
                kind=SpanKind.CLIENT if kind in ("model_call", "tool_call") else SpanKind.INTERNAL,
                status=Status(STATUS.get(span["status"], StatusCode.UNSET)),
                start_time=_nanos(span["started_at"]),
                end_time=_nanos(span["ended_at"] or span["started_at"]),
                instrumentation_scope=SCOPE,
            )
        )
    return out


def _hex_ids(document: dict) -> dict:
    """OTLP/JSON writes ids in hex; protobuf's JSON mapping writes bytes in base64."""
    for resource_spans in document.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for name in ("traceId", "spanId", "parentSpanId"):
                    if span.get(name):
                        span[name] = base64.b64decode(span[name]).hex()
    return document


def otlp_example() -> dict:
    """What the download looks like (the API's example): one model call of run 42."""
    span = {"id": 905, "run_id": 42, "parent_id": 903, "task_id": 7, "kind": "model_call", "name": "gpt-4.1-mini",
            "status": "ok", "attempt": 1, "step": 3, "tokens_in": 512, "tokens_out": 48, "cost_micros": 400,
            "body": {"provider": "openai"}}  # fmt: skip
    runs = _Runs.__new__(_Runs)
    runs.resources = {42: Resource({"service.name": "warden", "warden.project": "default",
                                    "warden.workflow": "deploy-review"})}  # fmt: skip
    runs.agents, runs.providers = {7: "inventory-agent"}, {7: "openai"}
    moment = datetime(2026, 3, 14, 9, 12, 7, tzinfo=UTC)
    span.update(started_at=moment, ended_at=moment + timedelta(seconds=2))
    return _hex_ids(MessageToDict(encode_spans(readable_spans([span], runs))))


def run_otlp(run: Run) -> dict:
    """An ExportTraceServiceRequest in OTLP/JSON, built by the SDK's encoder."""
    spans = list(Span.objects.filter(run=run).order_by("id").values(*FIELDS))
    return _hex_ids(MessageToDict(encode_spans(readable_spans(spans))))


# --- the live export --------------------------------------------------------------------------------

_exporter = None


def export_enabled() -> bool:
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _export(spans: list[dict]) -> bool:
    global _exporter
    if _exporter is None:
        _exporter = OTLPSpanExporter()  # configured by the OTEL_EXPORTER_OTLP_* environment
    return _exporter.export(readable_spans(spans)) == SpanExportResult.SUCCESS


def _until(now) -> datetime:
    """Where this pass may stop: spans stamped before it are committed. A span's end is stamped before
    its transaction commits, so on PostgreSQL the pass also stops short of the oldest transaction still
    open (one that commits later would otherwise land behind the cursor and never go out)."""
    until = now - EXPORT_LAG
    if connection.vendor != "postgresql":
        return until  # embedded: one process, short transactions; the lag covers them
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT min(xact_start) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
        )
        (oldest,) = cursor.fetchone()
    if oldest is None:
        return until
    return max(min(until, oldest - EXPORT_LAG), now - EXPORT_HOLD)


def otlp_export_pass(now=None) -> dict:
    """One pass of the live export (a sweep: one process at a time holds the cursor). Spans that closed
    since the last pass go out: new ones by id, and older ones that were still open then by the time
    they ended. A failed export moves nothing: the same spans go in the next pass."""
    if not export_enabled():
        return {}
    until = _until(now or timezone.now())
    with transaction.atomic():
        cursor = OtlpExportCursor.objects.select_for_update(skip_locked=True).filter(id=1).first()
        if cursor is None:
            if OtlpExportCursor.objects.filter(id=1).exists():
                return {}  # another process is exporting
            last = Span.objects.order_by("-id").values_list("id", flat=True).first() or 0
            OtlpExportCursor.objects.get_or_create(id=1, defaults={"last_span_id": last, "since": until})
            return {"otlp_exported": 0}  # from now on: history is the per-run download's
        fresh = list(
            Span.objects.filter(id__gt=cursor.last_span_id, ended_at__isnull=False, ended_at__lte=until)
            .order_by("id").values(*FIELDS)[:EXPORT_BATCH]
        )  # fmt: skip
        ended = list(
            Span.objects.filter(id__lte=cursor.last_span_id, ended_at__gt=cursor.since, ended_at__lte=until)
            .order_by("ended_at", "id").values(*FIELDS)[:EXPORT_BATCH]
        )  # fmt: skip
        if not fresh and not ended:
            OtlpExportCursor.objects.filter(id=1).update(since=until)
            return {"otlp_exported": 0}
        if not _export(ended + fresh):
            log.warning("OTLP export of %s spans failed; they go again in the next pass", len(ended) + len(fresh))
            return {"otlp_failed": len(ended) + len(fresh)}
        full = len(ended) == EXPORT_BATCH  # the rest of the ended ones next time, from where this stopped
        OtlpExportCursor.objects.filter(id=1).update(
            last_span_id=fresh[-1]["id"] if fresh else cursor.last_span_id,
            since=ended[-1]["ended_at"] if full else until,
        )
    return {"otlp_exported": len(ended) + len(fresh)}


_exporting: threading.Thread | None = None


def otlp_export_sweep(now=None) -> dict:
    """The sweeper's hook: a pass in a thread of its own, so that a slow or absent collector (the SDK
    retries for OTEL_EXPORTER_OTLP_TIMEOUT) never holds up the recovery passes beside it."""
    global _exporting
    if not export_enabled() or (_exporting is not None and _exporting.is_alive()):
        return {}

    def run():
        try:
            otlp_export_pass()
        except Exception:  # the next pass tries again; the sweeper must not die of a collector
            log.exception("OTLP export pass failed")
        finally:
            connections.close_all()

    _exporting = threading.Thread(target=run, name="otlp export", daemon=True)
    _exporting.start()
    return {}
