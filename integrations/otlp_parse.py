"""Reading an OTLP/HTTP trace export (protobuf or JSON) into checked spans, before anything is written.

Every way a body can be wrong answers ``OtlpInvalid`` with what is wrong and where (``resourceSpans[0].
scopeSpans[1].spans[2].spanId: …``): the wrong type at any level, ids that are not hex or not of their
length, missing or backwards timestamps, bytes that are not UTF-8, a truncated protobuf, a span that is
its own ancestor. Strings lose their NUL characters (PostgreSQL's text and JSON refuse them).
"""

import base64
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from core.errors import InvalidInput

STATUS_ERROR = 2
ID_BYTES = {"traceId": 16, "spanId": 8, "parentSpanId": 8}
# protobuf's JSON reader takes a field by its JSON name or its proto name: so does the shape check
SNAKE = {"resourceSpans": "resource_spans", "scopeSpans": "scope_spans", "traceId": "trace_id",
         "spanId": "span_id", "parentSpanId": "parent_span_id"}  # fmt: skip
JSON_TYPES = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}


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
    parent_span_id: str = ""  # hex; "" for a trace's root
    attributes: dict = field(default_factory=dict)
    resource: dict = field(default_factory=dict)

    def attribute(self, *names, default=None):
        for name in names:
            for source in (self.attributes, self.resource):
                if source.get(name) not in (None, ""):
                    return source[name]
        return default


def _text(value: str) -> str:
    return value.replace("\x00", "")


def _value(any_value):
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    value = getattr(any_value, kind)
    if kind == "array_value":
        return [_value(v) for v in value.values]
    if kind == "kvlist_value":
        return {_text(kv.key): _value(kv.value) for kv in value.values}
    if kind == "bytes_value":
        return value.hex()
    if kind == "string_value":
        return _text(value)
    return value


def _attributes(pairs) -> dict:
    return {_text(kv.key)[:200]: _value(kv.value) for kv in pairs}


def _moment(nanos: int) -> datetime:
    return datetime.fromtimestamp(nanos / 1e9, tz=UTC)


# --- OTLP/JSON: the shape checked level by level, ids from hex ---------------------------------------------
def _json_type(value) -> str:
    return JSON_TYPES.get(type(value), "a number")


def _named(parent: dict, name: str) -> str:
    return SNAKE[name] if name not in parent and SNAKE.get(name) in parent else name


def _listed(parent: dict, name: str, where: str) -> list:
    value = parent.get(_named(parent, name))
    if value is None:
        return []
    if not isinstance(value, list):
        raise OtlpInvalid(f"{where}{name} must be a list, not {_json_type(value)}")
    return value


def _each_object(items: list, where: str):
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise OtlpInvalid(f"{where}[{i}] must be an object, not {_json_type(item)}")
        yield f"{where}[{i}]", item


def _objects(parent: dict, where: str, *, one: tuple = (), many: tuple = ()) -> None:
    """protobuf's JSON reader takes a string for a message (its letters as unknown fields): not here."""
    for name in one:
        if parent.get(name) is not None and not isinstance(parent[name], dict):
            raise OtlpInvalid(f"{where}.{name} must be an object, not {_json_type(parent[name])}")
    for name in many:
        for at, item in _each_object(_listed(parent, name, f"{where}."), f"{where}.{name}"):
            if name == "attributes":
                _objects(item, at, one=("value",))
            else:
                _objects(item, at, many=("attributes",))


def _json_ids(span: dict, where: str) -> None:
    """OTLP/JSON writes trace and span ids in hex; protobuf's JSON reader expects base64 for bytes."""
    for name, size in ID_BYTES.items():
        name = _named(span, name)
        value = span.get(name)
        if value in (None, "") and name in ("parentSpanId", "parent_span_id"):
            continue
        if not isinstance(value, str):
            raise OtlpInvalid(f"{where}.{name} must be a hex string, not {_json_type(value)}")
        try:
            raw = bytes.fromhex(value)
        except ValueError as exc:
            raise OtlpInvalid(f"{where}.{name} {value[:40]!r} is not hex") from exc
        if len(raw) != size:
            raise OtlpInvalid(f"{where}.{name}: {size * 2} hex digits expected, got {len(value)}")
        span[name] = base64.b64encode(raw).decode()


def _json_document(body: bytes) -> dict:
    try:
        document = json.loads(body or b"{}")
    except UnicodeDecodeError as exc:
        raise OtlpInvalid(f"the body is not UTF-8 (byte {exc.start})") from exc
    except (ValueError, RecursionError) as exc:
        raise OtlpInvalid(f"the body is not JSON: {str(exc)[:200]}") from exc
    if not isinstance(document, dict):
        raise OtlpInvalid(f"an OTLP/JSON export is an object with resourceSpans, not {_json_type(document)}")
    for at, resource_spans in _each_object(_listed(document, "resourceSpans", ""), "resourceSpans"):
        _objects(resource_spans, at, one=("resource",))
        _objects(resource_spans.get("resource") or {}, f"{at}.resource", many=("attributes",))
        for at_scope, scope_spans in _each_object(_listed(resource_spans, "scopeSpans", f"{at}."), f"{at}.scopeSpans"):
            _objects(scope_spans, at_scope, one=("scope",))
            _objects(scope_spans.get("scope") or {}, f"{at_scope}.scope", many=("attributes",))
            for at_span, span in _each_object(_listed(scope_spans, "spans", f"{at_scope}."), f"{at_scope}.spans"):
                _objects(span, at_span, one=("status",), many=("attributes", "events", "links"))
                _json_ids(span, at_span)
    return document


def _parse_error(exc: Exception) -> str:
    """protobuf's "Failed to parse a field: Failed to parse b field: …" as "a.b: …"."""
    message = str(exc)
    fields = re.findall(r"Failed to parse (\w+) field: ", message)
    rest = re.split(r"Failed to parse \w+ field: ", message)[-1]
    return f"{'.'.join(fields)}: {rest}"[:300] if fields else message[:300]


def _message(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    message = ExportTraceServiceRequest()
    if content_type.startswith("application/json"):
        document = _json_document(body)
        try:
            json_format.ParseDict(document, message, ignore_unknown_fields=True)
        except (json_format.ParseError, ValueError, TypeError, AttributeError, RecursionError) as exc:
            raise OtlpInvalid(f"not an OTLP trace export: {_parse_error(exc)}") from exc
    elif content_type.startswith("application/x-protobuf"):
        try:
            message.ParseFromString(body)
        except (DecodeError, ValueError, RecursionError) as exc:
            raise OtlpInvalid(f"not an OTLP trace export (protobuf): {str(exc)[:200]}") from exc
    else:
        raise OtlpInvalid("Content-Type must be application/x-protobuf or application/json")
    return message


# --- the spans, checked ------------------------------------------------------------------------------------
def _span(span, resource: dict, where: str) -> OtlpSpan:
    if len(span.trace_id) != 16 or len(span.span_id) != 8:
        raise OtlpInvalid(f"{where} ({span.name[:60]!r}): a trace id is 16 bytes and a span id 8")
    if not any(span.trace_id) or not any(span.span_id):
        raise OtlpInvalid(f"{where} ({span.name[:60]!r}): an id of zeros is not a valid trace or span id")
    if span.parent_span_id and (len(span.parent_span_id) != 8 or not any(span.parent_span_id)):
        raise OtlpInvalid(f"{where} ({span.name[:60]!r}): a parent span id is 8 bytes, not all zero")
    if not span.start_time_unix_nano:
        raise OtlpInvalid(f"{where} ({span.name[:60]!r}) has no startTimeUnixNano")
    if span.end_time_unix_nano and span.end_time_unix_nano < span.start_time_unix_nano:
        raise OtlpInvalid(f"{where} ({span.name[:60]!r}) ends before it starts")
    return OtlpSpan(
        trace_id=span.trace_id.hex(), span_id=span.span_id.hex(), parent_span_id=span.parent_span_id.hex(),
        name=_text(span.name)[:200] or "span", started=_moment(span.start_time_unix_nano),
        ended=_moment(span.end_time_unix_nano or span.start_time_unix_nano),
        error=span.status.code == STATUS_ERROR, attributes=_attributes(span.attributes), resource=resource,
    )  # fmt: skip


def _no_cycles(spans: list[OtlpSpan]) -> None:
    """A span may not be its own ancestor among the spans of one request."""
    parent_of = {(s.trace_id, s.span_id): s.parent_span_id for s in spans}
    for s in spans:
        seen, key = set(), (s.trace_id, s.span_id)
        while key in parent_of and parent_of[key]:
            if key in seen:
                raise OtlpInvalid(f"span {s.span_id} ({s.name[:60]!r}) is its own ancestor")
            seen.add(key)
            key = (key[0], parent_of[key])


def otlp_parse(body: bytes, content_type: str, *, max_spans: int) -> list[OtlpSpan]:
    """The spans of an ExportTraceServiceRequest, or OtlpInvalid with the reason."""
    message = _message(body, content_type)
    spans = []
    for i, resource_spans in enumerate(message.resource_spans):
        resource = _attributes(resource_spans.resource.attributes)
        for j, scope_spans in enumerate(resource_spans.scope_spans):
            for k, span in enumerate(scope_spans.spans):
                spans.append(_span(span, resource, f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]"))
                if len(spans) > max_spans:
                    raise OtlpInvalid(f"more than {max_spans} spans in one request")
    _no_cycles(spans)
    return spans
