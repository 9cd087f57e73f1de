"""The ninja API objects. The integration API (bearer tokens, no CSRF) lives under /api/v1; the
dashboard's own endpoints will be a separate object with session auth and CSRF."""

import time

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.security import HttpBearer

import runs.api_external  # noqa: F401  (its operations join the reads router)
from approvals.api import router as approvals_router
from approvals.tokens import api_token_authenticate
from runs.api import router as runs_router
from runs.api_reads import router as runs_reads_router
from runs.errors import Conflict, Forbidden, InvalidInput, NotFound
from runs.transitions import TransitionNotAllowed
from tools.api import router as tools_router


class RateLimited(Exception):
    def __init__(self, retry_after: int):
        self.retry_after = retry_after


class BearerToken(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str):
        found = api_token_authenticate(token)
        if found is not None:
            _rate_check(found.id)
        return found


def _rate_check(token_id: int) -> None:
    """A fixed one-minute window per token in the shared cache (Redis in scaled mode): over the limit,
    429 with Retry-After until the window ends. A guard against runaway clients, not a security control."""
    limit = settings.WARDEN["API_RATE_PER_MINUTE"]
    now = time.time()
    window = int(now // 60)
    key = f"api-rate:{token_id}:{window}"
    if cache.add(key, 1, timeout=120):
        return
    try:
        count = cache.incr(key)
    except ValueError:  # expired between the two calls
        cache.add(key, 1, timeout=120)
        return
    if count > limit:
        raise RateLimited(retry_after=max(1, int((window + 1) * 60 - now) + 1))


api = NinjaAPI(
    title="Warden API",
    version="1",
    urls_namespace="api-v1",
    auth=BearerToken(),
    description="Start and inspect durable multi-agent runs.",
)
api.add_router("/", runs_router)
api.add_router("/", runs_reads_router)
api.add_router("/", tools_router)
api.add_router("/", approvals_router)


def _error(request, status: int, code: str, message: str, errors: list | None = None):
    return api.create_response(request, {"code": code, "message": message, "errors": errors or []}, status=status)


def _field(loc) -> str:
    parts = [str(p) for p in loc if p not in ("body", "payload", "query", "path")]
    return ".".join(parts) or "body"


@api.exception_handler(ValidationError)
def on_validation_error(request, exc: ValidationError):
    errors = [{"field": _field(e.get("loc", ())), "message": e.get("msg", "invalid")} for e in exc.errors]
    return _error(request, 422, "invalid_input", "the request is invalid", errors)


@api.exception_handler(InvalidInput)
def on_invalid_input(request, exc: InvalidInput):
    return _error(request, 422, exc.code, str(exc), exc.errors)


@api.exception_handler(NotFound)
def on_not_found(request, exc: NotFound):
    return _error(request, 404, exc.code, str(exc))


@api.exception_handler(Forbidden)
def on_forbidden(request, exc):
    return _error(request, 403, exc.code, str(exc))


@api.exception_handler(Conflict)
def on_conflict(request, exc):
    return _error(request, 409, "conflict", str(exc))


@api.exception_handler(TransitionNotAllowed)
def on_transition(request, exc):
    return _error(request, 409, "transition_not_allowed", str(exc))


@api.exception_handler(RateLimited)
def on_rate_limited(request, exc: RateLimited):
    response = _error(request, 429, "rate_limited", f"too many requests for this token; retry in {exc.retry_after} s")
    response["Retry-After"] = str(exc.retry_after)
    return response


@api.exception_handler(AuthenticationError)
def on_auth(request, exc):
    return _error(request, 401, "unauthenticated", "a valid API token is required (Authorization: Bearer …)")


@api.exception_handler(HttpError)
def on_http_error(request, exc: HttpError):
    return _error(request, exc.status_code, "error", str(exc))
