"""Log lines that say which run, task, attempt, operation and request they were written for.

``log_context(run=…, task=…)`` sets the ids for the code inside it (contextvars: each thread and each
asyncio task keeps its own); ``ContextFilter`` puts them on every record of the console handler, and
``JsonFormatter`` writes one JSON object a line when WARDEN_LOG_FORMAT=json (settings). Ids only: a
log line never carries a body, an argument or a secret.
"""

import contextvars
import json
import logging
import re
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime

FIELDS = ("run", "task", "attempt", "operation", "request")
_context: contextvars.ContextVar[dict] = contextvars.ContextVar("warden_log_context", default={})  # noqa: B039
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._\-]{1,64}$")


@contextmanager
def log_context(**ids):
    """The given ids (None ones dropped) on every log line written inside, beside the ones already set."""
    token = _context.set({**_context.get(), **{k: v for k, v in ids.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def current() -> dict:
    return dict(_context.get())


class ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        ids = {**_context.get(), **{f: getattr(record, f) for f in FIELDS if getattr(record, f, None) is not None}}
        record.ids = ids
        record.context = "".join(f" {k}={v}" for k, v in ids.items())
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **getattr(record, "ids", {}),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class RequestIdMiddleware:
    """Each request gets an id (the proxy's X-Request-ID when it looks like one), on its log lines and
    echoed in the response's X-Request-ID."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        given = request.headers.get("X-Request-ID", "")
        request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        with log_context(request=request_id):
            response = self.get_response(request)
        response["X-Request-ID"] = request_id
        return response
