"""POST /v1/traces (and /api/v1/otlp/v1/traces): OTLP/HTTP trace export into Warden runs.

An OpenTelemetry exporter points at Warden (OTEL_EXPORTER_OTLP_ENDPOINT=https://warden.example/api/v1/otlp,
or the traces endpoint itself) with an API token in its headers (OTEL_EXPORTER_OTLP_HEADERS=
"Authorization=Bearer wdn_…"); the token needs the ``run`` scope in the projects its spans go to.
Protobuf and JSON bodies; a body over WARDEN_OTLP_MAX_BYTES answers 413, a bad one 400 with the reason,
and neither writes anything. Answers are OTLP's: an empty ExportTraceServiceResponse in the request's
encoding (errors are JSON in Warden's error shape).
"""

import gzip
import io
import json
import zlib

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from core.errors import Forbidden, InvalidInput, NotFound
from integrations.otlp_ingest import otlp_ingest, otlp_parse
from tenancy.tokens import api_token_authenticate

from .limits import RateLimited, rate_check

PROTOBUF, JSON = "application/x-protobuf", "application/json"


def _error(status: int, code: str, message: str, **headers) -> JsonResponse:
    response = JsonResponse({"code": code, "message": message, "errors": []}, status=status)
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def _body(request, limit: int) -> bytes:
    """The request's body, inflated if the exporter compressed it, never more than ``limit`` bytes."""
    body = request.body
    encoding = request.headers.get("Content-Encoding", "").lower()
    if encoding == "gzip":
        with gzip.GzipFile(fileobj=io.BytesIO(body)) as stream:
            body = stream.read(limit + 1)
    elif encoding == "deflate":
        body = zlib.decompressobj().decompress(body, limit + 1)
    elif encoding not in ("", "identity"):
        raise InvalidInput(f"Content-Encoding {encoding!r} is not supported (gzip, deflate)")
    if len(body) > limit:
        raise OverflowError
    return body


@csrf_exempt
def otlp_traces(request):
    if request.method != "POST":
        return _error(405, "method_not_allowed", "POST an OTLP trace export here")
    header = request.headers.get("Authorization", "")
    token = api_token_authenticate(header.removeprefix("Bearer ").strip()) if header.startswith("Bearer ") else None
    if token is None:
        return _error(401, "unauthorized", "an API token is required (Authorization: Bearer …)")
    limit = settings.WARDEN["OTLP_MAX_BYTES"]
    if int(request.headers.get("Content-Length") or 0) > limit:
        return _error(413, "too_large", f"an OTLP request may carry at most {limit} bytes")
    try:
        rate_check(token.token_hash[:16])
        content_type = request.content_type or ""
        spans = otlp_parse(_body(request, limit), content_type, max_spans=settings.WARDEN["OTLP_MAX_SPANS"])
        otlp_ingest(spans=spans, user=token.user, token=token, request=request,
                    default_workflow=settings.WARDEN["OTLP_WORKFLOW"])  # fmt: skip
    except RateLimited as exc:
        return _error(429, "rate_limited", "too many requests for this token", Retry_After=str(exc.retry_after))
    except OverflowError:
        return _error(413, "too_large", f"an OTLP request may carry at most {limit} bytes")
    except (InvalidInput, OSError, EOFError, zlib.error) as exc:
        return _error(400, "invalid_input", str(exc)[:500])
    except NotFound as exc:
        return _error(404, "not_found", str(exc))
    except Forbidden as exc:
        return _error(403, "forbidden", str(exc))
    if content_type.startswith(JSON):
        return HttpResponse(json.dumps({}), content_type=JSON)
    return HttpResponse(ExportTraceServiceResponse().SerializeToString(), content_type=PROTOBUF)
