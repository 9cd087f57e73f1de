"""HTTP tools: declared in the admin, per project, with no code (docs/tools.md, "HTTP tools").

A declaration is one request: a method, a URL template on a host the deployment allows
(WARDEN_HTTP_TOOL_HOSTS), the JSON Schema of its arguments (those not in the URL travel as the JSON body,
or as the query of a GET or DELETE), headers whose secrets are named ({secret:NAME}) and read at call
time, the idempotency header the service honours, an optional lookup by key and an optional undo.
Everything is checked when it is saved (``http_tool_problems``), and the host, the headers and the
secrets' grants again at every call.
"""

import hashlib
import json
import os
import re
import threading
from functools import partial
from http.cookiejar import CookieJar, DefaultCookiePolicy
from urllib.parse import quote, urlsplit

import httpx
from django.conf import settings
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from core.errors import TransientFailure

from .kit import (
    NAME,
    OpenResult,
    Reversibility,
    ToolClass,
    ToolMisconfigured,
    ToolRefused,
    ToolSpec,
    ToolTimeout,
    ToolUnavailable,
)
from .models import HttpTool, McpTool
from .registry import TOOLS
from .secrets import scrub, scrub_failure, secret_problems, secrets_for

PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
# The least a request of each method can be: a declaration below its method's floor is refused, and a
# row below it (written past the checks) is called as its floor.
METHOD_FLOORS = {
    "GET": ToolClass.READ_ONLY,
    "HEAD": ToolClass.READ_ONLY,
    "PUT": ToolClass.IDEMPOTENT_WRITE,
    "DELETE": ToolClass.IDEMPOTENT_WRITE,
    "POST": ToolClass.NON_IDEMPOTENT_WRITE,
    "PATCH": ToolClass.NON_IDEMPOTENT_WRITE,
}
_FLOOR_RANK = {ToolClass.READ_ONLY: 0, ToolClass.IDEMPOTENT_WRITE: 1, ToolClass.NON_IDEMPOTENT_WRITE: 2}
SECRET_REF = re.compile(r"\{secret:([^{}]*)\}")
HEADER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,99}$")
BODY_METHODS = ("POST", "PUT", "PATCH")
REFUSAL_TEXT = 200  # of a refusing answer's body, in the reason the model and the ledger see
# Headers that say where a request goes and how it is framed: httpx writes them, a declaration never
# does (a Host of its choosing reaches another virtual host behind a shared gateway).
WARDEN_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te", "trailer",
     "forwarded"}
)  # fmt: skip
WARDEN_HEADER_PREFIXES = ("proxy-", "x-forwarded-")


# --- hosts ------------------------------------------------------------------------------------------


def host_allowed(url: str) -> bool:
    """Is the URL's host one the deployment allows ("host" for any port, "host:port" for one)?"""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        return False
    for entry in settings.WARDEN["HTTP_TOOL_HOSTS"]:
        host, _, only = entry.lower().rpartition(":") if entry.count(":") == 1 else (entry.lower(), "", "")
        if host == parts.hostname.lower() and (not only or only == str(port)):
            return True
    return False


def url_problems(template: str, *, field: str, allowed: set[str]) -> list[tuple[str, str]]:
    """A URL template's problems: its scheme, host and port are literal and allowed; its placeholders
    are among ``allowed``."""
    fixed = template.split("{", 1)[0]
    parts = urlsplit(fixed)
    if "{" in template and not parts.path.startswith("/"):
        return [(field, "placeholders may stand only in the path or the query, after the host")]
    if not host_allowed(fixed if "{" not in template else f"{parts.scheme}://{parts.netloc}/"):
        hosts = ", ".join(settings.WARDEN["HTTP_TOOL_HOSTS"]) or "none (set WARDEN_HTTP_TOOL_HOSTS)"
        return [(field, f"the host must be one this deployment allows: {hosts}; http(s), no user or password")]
    unknown = sorted(set(PLACEHOLDER.findall(template)) - allowed)
    return [(field, f"unknown placeholders {unknown}; allowed: {sorted(allowed)}")] if unknown else []


# --- checking a declaration -------------------------------------------------------------------------


def header_refusal(name: str) -> str | None:
    """Why a declaration may not set the header ``name``, if it may not."""
    lowered = str(name).lower()
    if lowered in WARDEN_HEADERS or lowered.startswith(WARDEN_HEADER_PREFIXES):
        return f"{name}: a header Warden sets itself (Host, framing, proxies); a declaration may not set it"
    return None


def _schema_problems(schema) -> list[tuple[str, str]]:
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return [("arguments_schema", 'a JSON Schema of an object: {"type": "object", "properties": {...}}')]
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return [("arguments_schema", f"not a valid JSON Schema: {exc.message[:200]}")]
    return []


def _header_problems(headers, *, project_id: int | None) -> list[tuple[str, str]]:
    """The headers' problems, their secrets' as the project may use them (``project_id`` None: no project
    chosen yet, so no secret may be named)."""
    if not isinstance(headers, dict):
        return [("headers", 'an object: {"Header-Name": "value with {secret:NAME}"}')]
    problems = []
    for name, value in headers.items():
        if not HEADER_NAME.fullmatch(str(name)) or not isinstance(value, str) or "\n" in value or "\r" in value:
            problems.append(("headers", f"{name!r}: a header name and a one-line text value"))
            continue
        if refusal := header_refusal(name):
            problems.append(("headers", refusal))
        if any(not p.startswith("secret:") for p in PLACEHOLDER.findall(value)):
            problems.append(("headers", f"{name}: only {{secret:NAME}} placeholders (a header never takes arguments)"))
        named = SECRET_REF.findall(value)
        if named and project_id is None:
            problems.append(("headers", f"{name}: choose the project first: secrets are granted to projects"))
        elif named:
            problems += [("headers", f"{name}: {why}") for why in secret_problems(named, project_id=project_id)]
    return problems


def _undo_problems(row: HttpTool) -> list[tuple[str, str]]:
    undo = row.undo
    if undo is None or (not undo and not isinstance(undo, dict)):  # null, [], "", false: the column holds an object
        return [("undo", "an object, or {} for none")]
    if not undo:
        return []
    if row.tool_class == ToolClass.READ_ONLY:
        return [("undo", "a read has nothing to undo")]
    if (
        not isinstance(undo, dict)
        or not isinstance(undo.get("tool"), str)
        or not isinstance(undo.get("arguments", {}), dict)
    ):
        return [("undo", '{"tool": "system.operation", "arguments": {"name": "result.field"}}')]
    tool = undo["tool"]
    project_tool = HttpTool.objects.filter(project_id=row.project_id, name=tool, enabled=True).exclude(id=row.id)
    if (tool not in TOOLS or TOOLS[tool].internal) and not project_tool.exists():
        return [("undo", f"the undo names the tool {tool!r}, which is not registered or declared in this project")]
    return []


def method_floor(method: str) -> str:
    """The least class a request of this method can be (an unknown method: the most dangerous)."""
    return METHOD_FLOORS.get(str(method).upper(), ToolClass.NON_IDEMPOTENT_WRITE)


def _class_problems(row: HttpTool) -> list[tuple[str, str]]:
    """The class is a claim that may only be stricter than what the method says; reversible needs an undo."""
    if row.tool_class not in ToolClass.ALL:
        return [("tool_class", f"one of {', '.join(ToolClass.ALL)}")]
    floor = method_floor(row.method)
    if _FLOOR_RANK[row.tool_class] < _FLOOR_RANK[floor]:
        return [
            (
                "tool_class",
                f"a {row.method} request is at least a {floor.replace('_', ' ')}: declare {floor} or stricter "
                "(GET and HEAD read; PUT and DELETE are idempotent writes; POST and PATCH non-idempotent writes)",
            )
        ]
    if row.tool_class == ToolClass.READ_ONLY and row.reversibility:
        return [("reversibility", "a read changes nothing: leave it empty")]
    if row.tool_class != ToolClass.READ_ONLY and row.reversibility not in Reversibility.ALL[1:]:
        return [("reversibility", "a write is reversible or irreversible")]
    if row.reversibility == Reversibility.REVERSIBLE and not row.undo:
        return [("reversibility", "a reversible write names the tool that undoes it (undo); otherwise irreversible")]
    return []


def _example_problems(row: HttpTool) -> list[tuple[str, str]]:
    if row.example_answer is None:
        return []
    if not isinstance(row.example_answer, dict):
        return [("example_answer", "an object, as the service's answer is")]
    if row.tool_class == ToolClass.READ_ONLY:
        return [("example_answer", "a read has none: a replay answers reads from the original run's ledger")]
    return []


def _repeatable_problems(row: HttpTool) -> list[tuple[str, str]]:
    if row.repeatable and (row.tool_class != ToolClass.READ_ONLY or row.method not in ("GET", "HEAD")):
        return [("repeatable", "only a read (GET or HEAD, read only) may be sent again by a replay")]
    return []


def http_tool_problems(row: HttpTool) -> list[tuple[str, str]]:
    """What is wrong with a declaration, as (field, message); empty when it may be saved."""
    problems = []
    if not NAME.fullmatch(row.name or ""):
        problems.append(("name", "system.operation in lower case, e.g. payments.refund"))
    elif row.name in TOOLS:
        problems.append(("name", "a tool of Warden's registry (Python) already has this name"))
    elif row.project_id and McpTool.objects.filter(server__project_id=row.project_id, name=row.name).exists():
        problems.append(("name", "an MCP tool of this project already has this name"))
    if row.method not in HttpTool.Method.values:
        problems.append(("method", f"one of {', '.join(HttpTool.Method.values)}"))
    else:
        problems += _class_problems(row)
    if row.tool_class == ToolClass.IDEMPOTENT_WRITE and not row.idempotency_header:
        problems.append(("idempotency_header", "an idempotent write names the header the service deduplicates by"))
    if row.idempotency_header and not HEADER_NAME.fullmatch(row.idempotency_header):
        problems.append(("idempotency_header", "a header name: letters, digits and -"))
    elif row.idempotency_header and (refusal := header_refusal(row.idempotency_header)):
        problems.append(("idempotency_header", refusal))
    schema = _schema_problems(row.arguments_schema)
    problems += schema
    properties = set((row.arguments_schema or {}).get("properties") or {}) if not schema else set()
    required = set((row.arguments_schema or {}).get("required") or []) if not schema else set()
    problems += url_problems(row.url or "", field="url", allowed=properties)
    missing = sorted(set(PLACEHOLDER.findall(row.url or "")) & properties - required)
    if missing:
        problems.append(("arguments_schema", f"the URL's placeholders must be required arguments: {missing}"))
    if row.lookup_url:
        problems += url_problems(row.lookup_url, field="lookup_url", allowed={"key"})
    problems += _header_problems(row.headers, project_id=row.project_id)
    problems += _undo_problems(row)
    problems += _example_problems(row)
    problems += _repeatable_problems(row)
    if not (0 < (row.timeout_seconds or 0) <= 3600):
        problems.append(("timeout_seconds", "between 0 and 3600 seconds"))
    return problems


# --- calling ----------------------------------------------------------------------------------------


def _secret_headers(headers: dict, secrets: dict) -> dict:
    """The headers as sent. Checked again here: a row written straight to the database is not sent with
    a Host or a framing header either."""
    for name in headers:
        if refusal := header_refusal(name):
            raise ToolMisconfigured(refusal)
    return {name: SECRET_REF.sub(lambda m: secrets[m.group(1)], value) for name, value in headers.items()}


def _filled(template: str, values: dict) -> str:
    # Each value is quoted whole (a "/" too): an argument can change a path segment, never the host.
    return PLACEHOLDER.sub(lambda m: quote(str(values[m.group(1)]), safe=""), template)


def _answer(response: httpx.Response, secrets: dict) -> dict:
    """The service's answer as the tool's result, or the failure it means for the ledger. A refusal's body
    is scrubbed before it is cut: a secret across the cut would leave a half nothing recognises."""
    code = response.status_code
    if 200 <= code < 300:
        try:
            body = response.json() if response.content else {}
        except ValueError:
            body = {"text": response.text}
        return body if isinstance(body, dict) else {"body": body}
    if code in (429, 503):
        raise ToolUnavailable(f"HTTP {code}, the service asks to try later")
    if code in (408, 500, 502, 504):  # the request may have been acted on before the failure
        raise ToolTimeout(f"HTTP {code}, the outcome is unknown")
    text = scrub(response.text, secrets.values())[:REFUSAL_TEXT]
    if 300 <= code < 400:
        raise ToolMisconfigured(f"HTTP {code}, a redirect (not followed)")
    if code in (401, 407):  # the credential, not the arguments: no model can mend it
        raise ToolMisconfigured(f"HTTP {code}: {text}")
    # The service's own answer to these arguments: a model-driven agent reads it and may correct its call.
    raise ToolRefused(f"HTTP {code}: {text}", code=f"http_{code}")


_clients: dict[int, httpx.Client] = {}
_clients_lock = threading.Lock()
KEEPALIVE_SECONDS = 1.0


def _client() -> httpx.Client:
    """This process's client (a fork makes its own): a client per call cost ~20 ms of building its TLS
    context, even for http://. Its connections are reused for a second at most: one idle for longer may be
    closed by the server (uvicorn after 5 s, nginx 75 s) just as a call goes out on it, which would make
    the call ambiguous."""
    pid = os.getpid()
    with _clients_lock:
        if pid not in _clients:
            _clients.clear()  # a parent's client is not used in its child
            limits = httpx.Limits(keepalive_expiry=KEEPALIVE_SECONDS)
            # A jar that keeps no cookie: the client is shared by every project's tools, and a cookie one
            # service set must never ride along with another call (to the same host, by another project).
            keeps_none = CookieJar(DefaultCookiePolicy(allowed_domains=[]))
            _clients[pid] = httpx.Client(follow_redirects=False, limits=limits, cookies=keeps_none)
        return _clients[pid]


def _send(method: str, url: str, *, headers: dict, deadline: float, tool: str, **body) -> httpx.Response:
    if not host_allowed(url):  # the deployment's allowlist may have changed since the tool was saved
        raise ToolMisconfigured("its host is no longer allowed (WARDEN_HTTP_TOOL_HOSTS)")
    try:
        return _client().request(method, url, headers=headers, timeout=deadline, follow_redirects=False, **body)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # nothing was sent
        raise ToolUnavailable(f"cannot connect ({type(exc).__name__})") from exc
    except httpx.HTTPError as exc:  # sent, and no (whole) answer: it may have been acted on
        raise ToolTimeout(f"no answer ({type(exc).__name__})") from exc


def _execute(row: HttpTool, values: dict, *, key: str, deadline: float, secrets: dict, **_drill) -> dict:
    in_url = set(PLACEHOLDER.findall(row.url))
    rest = {k: v for k, v in values.items() if k not in in_url}
    headers = _secret_headers(row.headers or {}, secrets)
    if row.idempotency_header:
        if refusal := header_refusal(row.idempotency_header):
            raise ToolMisconfigured(refusal)
        headers[row.idempotency_header] = key
    body = {"json": rest} if row.method in BODY_METHODS else {"params": rest} if rest else {}
    response = _send(row.method, _filled(row.url, values), headers=headers, deadline=deadline, tool=row.name, **body)
    return _answer(response, secrets)


def _lookup(row: HttpTool, key: str, names: tuple[str, ...]) -> dict | None:
    secrets = {}
    try:
        secrets = secrets_for(names, project_id=row.project_id)  # the same door as the call's
        headers = _secret_headers(row.headers or {}, secrets)
        response = _send("GET", _filled(row.lookup_url, {"key": key}), headers=headers, deadline=row.timeout_seconds,
                         tool=row.name)  # fmt: skip
        if response.status_code == 404:
            return None
        return scrub(_answer(response, secrets), secrets.values())
    except (ToolUnavailable, ToolTimeout, ToolRefused) as exc:  # not an answer: ask again later
        failure = TransientFailure(f"the lookup of {row.name} by key failed: {exc}")
        raise scrub_failure(failure, secrets.values()) from None


def _derived(value, arguments: dict, result: dict):
    if isinstance(value, str) and value.startswith(("arguments.", "result.")):
        source, _, field = value.partition(".")
        return (arguments if source == "arguments" else result).get(field)
    return value


def _undo(row: HttpTool):
    tool, mapping = row.undo["tool"], row.undo.get("arguments") or {}

    def undo(arguments: dict, result: dict) -> tuple[str, dict]:
        return tool, {name: _derived(value, arguments, result or {}) for name, value in mapping.items()}

    undo.__name__ = f"calling {tool}"
    return undo


def http_tool_called_as(row: HttpTool) -> tuple[str, str]:
    """The class and reversibility a call of this row is treated as: never below its method's floor, and
    a write that names no undo is irreversible (a row written past the checks gets no looser treatment)."""
    tool_class = row.tool_class if row.tool_class in ToolClass.ALL else ToolClass.NON_IDEMPOTENT_WRITE
    floor = method_floor(row.method)
    if _FLOOR_RANK[tool_class] < _FLOOR_RANK[floor]:
        tool_class = floor
    if tool_class == ToolClass.READ_ONLY:
        return tool_class, Reversibility.NONE
    reversible = row.reversibility == Reversibility.REVERSIBLE and bool(row.undo)
    return tool_class, Reversibility.REVERSIBLE if reversible else Reversibility.IRREVERSIBLE


def http_tool_declaration(row: HttpTool) -> str:
    """What a call of this tool is, as a digest: where it goes, how, with which headers (the secrets by
    name), and what it claims to be. An approval binds it (tools/gate.py)."""
    parts = [
        "http",
        row.method,
        row.url,
        row.headers or {},
        row.idempotency_header,
        row.lookup_url,
        row.tool_class,
        row.reversibility,
    ]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def http_tool_spec(row: HttpTool) -> ToolSpec:
    """The broker's view of a declaration: the same ToolSpec as a Python tool's."""
    names = tuple(sorted({s for value in (row.headers or {}).values() for s in SECRET_REF.findall(str(value))}))
    tool_class, reversibility = http_tool_called_as(row)
    return ToolSpec(
        name=row.name,
        system=row.name.partition(".")[0],
        tool_class=tool_class,
        reversibility=reversibility,
        arguments=OpenResult,
        result=OpenResult,
        execute=partial(_execute, row),
        lookup=(lambda key: _lookup(row, key, names)) if row.lookup_url else None,
        undo=_undo(row) if row.undo else None,
        undo_tool=(row.undo or {}).get("tool", ""),
        timeout_seconds=row.timeout_seconds,
        rate_per_minute=row.rate_per_minute,
        description=row.description,  # none: the model is told the tool's name, never its address
        secrets=names,
        external_id=row.external_id,
        module=f"HTTP tool {row.id} of project {row.project_id}",
        cut_off=True,
        parameters=row.arguments_schema,
        project_id=row.project_id,
        kind="http",
        declaration=http_tool_declaration(row),
        on_refusal=row.on_refusal,
        # A replay's stand-in for a write it does not send (tools/replaying.py); reads have none.
        replay_result=row.example_answer if tool_class != ToolClass.READ_ONLY else None,
        repeatable=row.repeatable and tool_class == ToolClass.READ_ONLY,
    )


def http_tool_find(name: str, project_id: int) -> ToolSpec | None:
    row = HttpTool.objects.filter(project_id=project_id, name=name, enabled=True).first()
    return http_tool_spec(row) if row is not None else None
