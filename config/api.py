"""The ninja API objects. The integration API (bearer tokens, no CSRF) lives under /api/v1; the
dashboard's own endpoints will be a separate object with session auth and CSRF."""

from django.db import DataError
from django.http import HttpRequest
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.security import HttpBearer

import api.external  # noqa: F401  (its operations join the reads router)
from api.approvals import router as approvals_router
from api.declarations import router as declarations_router
from api.evals import router as evals_router
from api.governance import router as governance_router
from api.inbox import router as inbox_router
from api.limits import RateLimited, rate_check
from api.questions import router as questions_router
from api.reads import router as runs_reads_router
from api.replays import router as replays_router
from api.runs import router as runs_router
from api.shadows import router as shadows_router
from api.tools import router as tools_router
from api.workers import router as workers_router
from core.errors import Conflict, Forbidden, InvalidInput, NotFound
from runs.transitions import TransitionNotAllowed
from tenancy.tokens import api_token_authenticate


class BearerToken(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str):
        found = api_token_authenticate(token)
        if found is not None:
            rate_check(found.token_hash[:16])  # not the id: ids are reused after a rollback (tests)
        return found


# The message of a request the schema itself refuses; a rule the schema cannot state (a workflow that
# exists, a fault's task in that workflow) answers the same code with its own message.
SCHEMA_REJECTED = "the request is invalid"

ERROR_RESPONSES = {
    "400": "Bad request (an Idempotency-Key that is too long, a body that is not JSON)",
    "401": "No valid API token",
    "403": "The role or the token's scope does not allow it",
    "404": "Does not exist, or belongs to a project of others",
    "409": "Conflicts with the object's state, or an Idempotency-Key reused or in flight",
    "422": "Invalid input: field errors",
    "429": "Over the token's rate limit (see Retry-After)",
}
ERROR_SCHEMA = {
    "title": "Error",
    "type": "object",
    "required": ["code", "message", "errors"],
    "properties": {
        "code": {"type": "string", "examples": ["not_found"]},
        "message": {"type": "string"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["field", "message"],
                "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
}


def _first_example(schema: dict, components: dict):
    """A media type's example from its schema: the schema's (or referenced component's) first one, or for
    an array, its items' first one in a list. None when there is none."""
    if "$ref" in schema:
        schema = components.get(schema["$ref"].removeprefix("#/components/schemas/"), {})
    if schema.get("examples"):
        return schema["examples"][0]
    if schema.get("type") == "array" and "items" in schema:
        item = _first_example(schema["items"], components)
        return None if item is None else [item]
    return None


def _add_examples(operation: dict, components: dict) -> None:
    # Swagger UI shows a media type's `example`, but not always one that sits on a referenced schema.
    media = [operation.get("requestBody", {}).get("content", {}).get("application/json")]
    for code, response in operation["responses"].items():
        if str(code).startswith("2"):
            media.append(response.get("content", {}).get("application/json"))
    for content in media:
        if content and "example" not in content:
            example = _first_example(content.get("schema", {}), components)
            if example is not None:
                content["example"] = example


class WardenAPI(NinjaAPI):
    """The schema documents what the exception handlers below answer, for every operation, the
    Idempotency-Key header every write accepts (integrations/idempotency.py), and an example of each request
    and success body (from the schemas' own examples)."""

    def get_openapi_schema(self, *, path_prefix=None, path_params=None):
        schema = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components["Error"] = ERROR_SCHEMA
        error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
        for methods in schema["paths"].values():
            for method, operation in methods.items():
                _add_examples(operation, components)
                for code, text in ERROR_RESPONSES.items():
                    if code == "400" and method not in ("post", "put"):
                        continue
                    operation["responses"].setdefault(code, {"description": text, "content": error})
                if method == "post":
                    operation.setdefault("parameters", []).append(
                        {
                            "name": "Idempotency-Key",
                            "in": "header",
                            "required": False,
                            "description": "The same key and body return the first response (kept 72 h)",
                            "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"},
                        }
                    )
        return schema

    # Operation ids are named after the module that first served them (ninja's default); the routers
    # moved to api/ (the HTTP layer) but clients generated from the schema keep their names.
    OPERATION_ID_MODULES = {
        "api.runs": "runs.api",
        "api.reads": "runs.api_reads",
        "api.external": "runs.api_external",
        "api.tools": "tools.api",
        "api.approvals": "approvals.api",
        "api.questions": "approvals.api",
        "api.inbox": "approvals.api",
        "api.evals": "runs.api_evals",
        "api.workers": "runs.api",  # the engine's worker registry (new: no older name to keep)
        "api.governance": "approvals.api",  # change requests, decided by the project's admins (new)
        "api.declarations": "approvals.api",  # declarations as code, the approvals app's (new)
        "api.replays": "runs.api",  # what-if replays of runs (new)
        "api.shadows": "runs.api",  # shadows of live runs (new)
    }

    def get_openapi_operation_id(self, operation) -> str:
        func = operation.view_func
        module = self.OPERATION_ID_MODULES.get(func.__module__, func.__module__)
        return f"{module}_{func.__name__}".replace(".", "_")


api = WardenAPI(
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
api.add_router("/", inbox_router)
api.add_router("/", questions_router)
api.add_router("/", evals_router)
api.add_router("/", workers_router)
api.add_router("/", governance_router)
api.add_router("/", declarations_router)
api.add_router("/", replays_router)
api.add_router("/", shadows_router)


def _error(request, status: int, code: str, message: str, errors: list | None = None):
    return api.create_response(request, {"code": code, "message": message, "errors": errors or []}, status=status)


def _field(loc) -> str:
    parts = [str(p) for p in loc if p not in ("body", "payload", "query", "path")]
    return ".".join(parts) or "body"


@api.exception_handler(ValidationError)
def on_validation_error(request, exc: ValidationError):
    errors = [{"field": _field(e.get("loc", ())), "message": e.get("msg", "invalid")} for e in exc.errors]
    return _error(request, 422, "invalid_input", SCHEMA_REJECTED, errors)


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
    return _error(request, 409, exc.code, str(exc))


@api.exception_handler(TransitionNotAllowed)
def on_transition(request, exc):
    return _error(request, 409, "transition_not_allowed", str(exc))


@api.exception_handler(OverflowError)
@api.exception_handler(DataError)
def on_out_of_range(request, exc):
    # An id or number beyond what the database stores (SQLite raises OverflowError, PostgreSQL DataError).
    return _error(request, 422, "invalid_input", "a number in the request is out of range")


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
