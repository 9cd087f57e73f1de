"""MCP tools: the tools of MCP servers a project connects (docs/tools.md, "MCP tools").

Through the official SDK (``mcp``), over streamable HTTP (a host the deployment allows) or stdio (a
command the deployment names in WARDEN_MCP_COMMANDS; a project admin picks one, never types one). When
a server is saved its tools are listed, with the class their annotations suggest:

- readOnlyHint: a read;
- idempotentHint: an idempotent write (a repeat with the same arguments changes nothing more);
- otherwise, and for a tool without annotations, a non-idempotent write;
- every write is irreversible: MCP has no way to say how an effect is undone.

The suggestion is the server's word, and MCP calls annotations untrusted hints: a listed tool stays
unclassified (every call waits for a reviewer) until a project admin confirms a class, a tool
classification of the same name (tools/catalog.py).

Every call goes through the broker like any tool's: gate, ledger, approvals, budgets, journal; the
idempotency key travels in the request's _meta (``io.warden/idempotency-key``) for servers that
deduplicate by it.
"""

import asyncio
import hashlib
import json
import logging
import os
import re
import tempfile
import threading
from contextlib import contextmanager
from functools import partial
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from tenancy.audit import audit

from .http_tools import SECRET_REF, _header_problems, _secret_headers, host_allowed, url_problems
from .kit import (
    OpenResult,
    Reversibility,
    ToolClass,
    ToolMisconfigured,
    ToolRefused,
    ToolSpec,
    ToolTimeout,
    ToolUnavailable,
)
from .mcp_sessions import NotSent, mcp_session_call, session_key
from .models import HttpTool, McpServer, McpTool
from .registry import TOOLS
from .secrets import scrub, secret_problems, secrets_for

log = logging.getLogger("warden.tools")
KEY_META = "io.warden/idempotency-key"
STDERR_KEPT = 64 * 1024  # of what a stdio server writes on stderr, the end relayed to the log
SERVER_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
LIST_LIMIT = 200  # tools one server may bring
KEEPALIVE_SECONDS = 1.0


class McpUnreachable(Exception):
    """The server did not answer (or not as an MCP server does)."""


class McpRefused(ToolMisconfigured):
    """The server's declaration may not be used as it is: ``problems`` are (field, message) pairs."""

    def __init__(self, problems: list[tuple[str | None, str]]):
        super().__init__("; ".join(message for _, message in problems))
        self.problems = problems


def annotation_class(annotations: dict | None) -> tuple[str, str]:
    """The side-effect class and reversibility an MCP tool's annotations suggest (none: the most dangerous).
    Only a suggestion, shown to the project admin who confirms a class: never what a call is treated as."""
    annotations = annotations or {}
    if annotations.get("readOnlyHint") is True:
        return ToolClass.READ_ONLY, Reversibility.NONE
    if annotations.get("idempotentHint") is True:
        return ToolClass.IDEMPOTENT_WRITE, Reversibility.IRREVERSIBLE
    return ToolClass.NON_IDEMPOTENT_WRITE, Reversibility.IRREVERSIBLE


def warden_name(server: str, remote: str) -> str:
    """<server>.<tool>, in the lower case letters, digits and _ Warden's tool names use."""
    tool = re.sub(r"[^a-z0-9_]+", "_", remote.lower()).strip("_") or "tool"
    return f"{server}.{tool if tool[0].isalpha() else 't_' + tool}"[:64]


# --- talking to a server ----------------------------------------------------------------------------


def _connection(server: McpServer, secrets: dict) -> dict:
    """What a session with the server is opened with: a stdio command with its environment (the secrets in
    it), or a streamable HTTP address with the secret headers. ``secrets``: read by ``secrets_for`` for the
    server's project. The command and the host are checked again: the deployment may have changed its mind
    since the server was saved."""
    from mcp.client.stdio import get_default_environment

    if server.transport == McpServer.Transport.STDIO:
        command = mcp_command(server.command)
        if command is None:
            raise ToolMisconfigured(f"the MCP command {server.command!r} is not one WARDEN_MCP_COMMANDS names")
        argv, passed = command
        environment = {**get_default_environment(), **{n: os.environ[n] for n in passed if n in os.environ}}
        environment.update({name: secrets[name] for name in server.secrets or [] if name in secrets})
        return {"stdio": argv, "env": environment}
    if not host_allowed(server.url):
        raise ToolMisconfigured("its host is not one this deployment allows (WARDEN_HTTP_TOOL_HOSTS)")
    return {"url": server.url, "headers": _secret_headers(server.headers or {}, secrets)}


def _target(connection: dict, errlog=None):
    """The SDK's transport for a connection (the SDK is imported where it is used: it is large, and most
    processes never talk to an MCP server)."""
    import httpx2  # the SDK's HTTP client
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

    if "stdio" in connection:
        argv = connection["stdio"]
        parameters = StdioServerParameters(command=argv[0], args=list(argv[1:]), env=connection["env"])
        return stdio_client(parameters, errlog=errlog)
    # A kept session's connections are reused for a second at most: one idle for longer may be closed by the
    # server (uvicorn after 5 s, nginx 75 s) just as a call goes out on it, which would make the call ambiguous.
    timeout = httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT)
    client = httpx2.AsyncClient(
        headers=connection["headers"], timeout=timeout, limits=httpx2.Limits(keepalive_expiry=KEEPALIVE_SECONDS)
    )
    return streamable_http_client(connection["url"], http_client=client)


@contextmanager
def _stderr_relay(server: McpServer, secrets: dict):
    """Where a stdio server's stderr goes: a file of its own, relayed to the log when the session is
    over and scrubbed (a server may print the credentials it was given), never straight into the
    worker's own stderr. None for an HTTP server."""
    if server.transport != McpServer.Transport.STDIO:
        yield None
        return
    with tempfile.TemporaryFile("w+b") as errlog:
        try:
            yield errlog
        finally:
            size = errlog.seek(0, os.SEEK_END)
            errlog.seek(max(0, size - STDERR_KEPT))
            text = errlog.read().decode(errors="replace")
            if size > STDERR_KEPT:  # its first line was cut: dropped whole, so no secret is left in halves
                text = text.partition("\n")[2]
            if text.strip():
                said = scrub(text, secrets.values()).strip()[-4000:]
                log.info("the MCP server %s of project %s wrote on stderr:\n%s", server.name, server.project_id, said)


def mcp_command(name: str) -> tuple[list[str], list[str]] | None:
    """A command the deployment names: its argv, and the environment variables it passes through
    (WARDEN_MCP_COMMANDS: {"name": ["argv", ...]} or {"name": {"argv": [...], "env": ["VAR", ...]}})."""
    entry = settings.WARDEN["MCP_COMMANDS"].get(name)
    if isinstance(entry, dict):
        entry, passed = entry.get("argv"), entry.get("env") or []
    else:
        passed = []
    if not entry or not isinstance(entry, list):
        return None
    return [str(a) for a in entry], [str(v) for v in passed]


def _in_thread(coroutine_factory, timeout: float):
    """Run an async SDK call to completion from synchronous code (a worker, an admin view), in a thread
    of its own so that it never meets the caller's event loop."""
    box: dict = {}

    def run():
        try:
            box["result"] = asyncio.run(asyncio.wait_for(coroutine_factory(), timeout))
        except BaseException as exc:  # handed to the caller as it is
            box["error"] = exc

    thread = threading.Thread(target=run, name="mcp client", daemon=True)
    thread.start()
    thread.join(timeout + 5)
    if "error" in box:
        raise box["error"]
    if "result" not in box:
        raise TimeoutError(f"no answer within {timeout:g}s")
    return box["result"]


def mcp_list(server: McpServer) -> list[dict]:
    """The server's tools as it lists them now: [{remote_name, description, input_schema, annotations}].
    An outbound call under a tool call's rules: the host or command the deployment allows, the secrets
    granted to the server's project, and what comes back scrubbed (descriptions, errors)."""
    from mcp import Client

    secrets = secrets_for(_server_secrets(server), project_id=server.project_id)

    async def listing(errlog):
        async with Client(
            _target(_connection(server, secrets), errlog), mode="legacy", read_timeout_seconds=server.timeout_seconds
        ) as client:
            tools, cursor = [], None
            while len(tools) < LIST_LIMIT:
                page = await client.list_tools(cursor=cursor)
                tools += page.tools
                cursor = page.next_cursor
                if not cursor:
                    break
            return tools

    try:
        with _stderr_relay(server, secrets) as errlog:
            tools = _in_thread(partial(listing, errlog), server.timeout_seconds)
    except ToolRefused:
        raise
    except BaseException as exc:  # noqa: BLE001  (whatever the transport raised: the server did not answer)
        text = scrub(str(exc), secrets.values())[:200]  # scrubbed before the cut
        raise McpUnreachable(f"the MCP server did not answer: {type(exc).__name__}: {text}") from None
    listed = [
        {
            "remote_name": t.name,
            "description": scrub(t.description or "", secrets.values())[:2000],
            "input_schema": t.input_schema if isinstance(t.input_schema, dict) else {"type": "object"},
            "annotations": t.annotations.model_dump(by_alias=True, exclude_none=True) if t.annotations else {},
        }
        for t in tools[:LIST_LIMIT]
    ]
    return scrub(listed, secrets.values())


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl() if "@" in parts.netloc else url


def mcp_server_list(*, server: McpServer, user, request=None) -> list[dict]:
    """List a server's tools as its project saves it (the admin, the examples' setup), audited whatever
    the outcome: listed, refused (with why: the declaration's problems, or a refusal at the call) or
    unreachable. Raises McpRefused or McpUnreachable; the audit row never holds a secret (refusals name
    secrets, never their values; errors are scrubbed)."""
    record = {"actor": user, "action": "mcp_server_list", "project_id": server.project_id,
              "target": f"mcp server {server.name}"[:200], "request": request}  # fmt: skip
    at = server.command if server.transport == McpServer.Transport.STDIO else _without_userinfo(server.url or "")
    detail = {"server": server.name, "transport": server.transport, "at": scrub(at)}
    problems = mcp_server_problems(server)
    try:
        if problems:
            raise McpRefused(problems)
        listed = mcp_list(server)
    except McpRefused as exc:
        audit(**record, outcome="refused", detail={**detail, "why": str(exc)[:1000]})
        raise
    except ToolRefused as exc:
        audit(**record, outcome="refused", detail={**detail, "why": str(exc)[:1000]})
        raise McpRefused([(None, str(exc))]) from None
    except McpUnreachable as exc:
        audit(**record, outcome="unreachable", detail={**detail, "why": str(exc)[:1000]})
        raise
    audit(**record, outcome="listed", detail={**detail, "tools": [t["remote_name"] for t in listed][:100]})
    return listed


def mcp_server_problems(server: McpServer) -> list[tuple[str, str]]:
    """What is wrong with a server's declaration before it is asked anything."""
    problems = []
    if not SERVER_NAME.fullmatch(server.name or ""):
        problems.append(("name", "lower case letters, digits and _, starting with a letter"))
    if server.transport == McpServer.Transport.STDIO:
        if server.command not in settings.WARDEN["MCP_COMMANDS"]:
            named = ", ".join(sorted(settings.WARDEN["MCP_COMMANDS"])) or "none (set WARDEN_MCP_COMMANDS)"
            problems.append(("command", f"one of the commands this deployment names: {named}"))
        secrets = server.secrets or []
        if not isinstance(secrets, list):
            problems.append(("secrets", 'a list of secret names: ["TICKETS_TOKEN"]'))
        elif secrets and server.project_id is None:
            problems.append(("secrets", "choose the project first: secrets are granted to projects"))
        elif secrets:
            problems += [("secrets", why) for why in secret_problems(secrets, project_id=server.project_id)]
    else:
        problems += url_problems(server.url or "", field="url", allowed=set())
        problems += _header_problems(server.headers or {}, project_id=server.project_id)
    if not (0 < (server.timeout_seconds or 0) <= 600):
        problems.append(("timeout_seconds", "between 0 and 600 seconds"))
    return problems


def mcp_listing_problems(server: McpServer, listed: list[dict]) -> list[tuple[str, str]]:
    """Names the listing would take that are taken already (a Python tool, an HTTP tool, twice)."""
    problems, seen = [], set()
    for tool in listed:
        name = warden_name(server.name, tool["remote_name"])
        if name in TOOLS:
            problems.append(("name", f"{name} would shadow a tool of Warden's registry"))
        elif server.project_id and HttpTool.objects.filter(project_id=server.project_id, name=name).exists():
            problems.append(("name", f"{name} is an HTTP tool of this project already"))
        elif name in seen:
            problems.append(("name", f"two of the server's tools become {name}"))
        seen.add(name)
    return problems


def mcp_tools_store(server: McpServer, listed: list[dict]) -> list[McpTool]:
    """Replace the server's tools by a listing, all at once."""
    rows = []
    for tool in listed:
        tool_class, reversibility = annotation_class(tool["annotations"])
        rows.append(
            McpTool(
                server=server,
                name=warden_name(server.name, tool["remote_name"]),
                tool_class=tool_class,
                reversibility=reversibility,
                **tool,
            )
        )
    with transaction.atomic():
        McpTool.objects.filter(server=server).delete()
        McpTool.objects.bulk_create(rows)
        McpServer.objects.filter(id=server.id).update(listed_at=timezone.now())
    return rows


def _result(answer, tool: str, secrets: dict) -> dict:
    text = "\n".join(getattr(c, "text", "") for c in answer.content or [] if getattr(c, "type", "") == "text")
    if answer.is_error:  # scrubbed before the cut (the broker scrubs the rest); the model may be told
        said = scrub(text, secrets.values())[:200]
        raise ToolRefused(f"the server answered with an error: {said}", code="tool_error")
    if isinstance(answer.structured_content, dict):
        return answer.structured_content
    try:
        body = json.loads(text)
    except ValueError:
        return {"text": text}
    return body if isinstance(body, dict) else {"body": body}


def _execute(row: McpTool, values: dict, *, key: str, deadline: float, secrets: dict, **_rest) -> dict:
    """One call on the process's session with the server (tools/mcp_sessions.py). ``secrets``: the broker
    read them for the server's project."""
    server = row.server
    connection = _connection(server, secrets)
    try:
        answer = mcp_session_call(
            key=session_key(server.id, connection),
            label=f"server {server.name} of project {server.project_id}",
            secrets=tuple(secrets.values()),
            target_factory=partial(_target, connection),
            stdio="stdio" in connection,
            use=lambda client: client.call_tool(row.remote_name, values, meta={KEY_META: key}),
            marker=key,
            deadline=deadline,
        )
    except ToolRefused:
        raise
    except NotSent as exc:
        raise ToolUnavailable(scrub(str(exc), secrets.values())[:200]) from None
    except BaseException as exc:  # noqa: BLE001  (sent, and no answer: it may have been acted on)
        what = f"{type(exc).__name__}: {scrub(str(exc), secrets.values())[:200]}"  # scrubbed before the cut
        raise ToolTimeout(what) from None
    return _result(answer, row.name, secrets)


def _server_secrets(server: McpServer) -> tuple[str, ...]:
    """Every secret the server is given (its environment's, its headers'): the broker reads them at the
    call, refuses the call when one is missing, and scrubs their values from the answer."""
    named = {s for s in server.secrets or [] if isinstance(s, str)} if server.transport == "stdio" else set()
    named |= {s for value in (server.headers or {}).values() for s in SECRET_REF.findall(str(value))}
    return tuple(sorted(named))


def mcp_tool_declaration(row: McpTool) -> str:
    """What a call of this tool is, as a digest: the server it goes to (its address, headers and secrets by
    name) and the tool there. An approval binds it (tools/gate.py)."""
    server = row.server
    parts = ["mcp", server.transport, server.url, server.command, server.headers or {}, server.secrets or [],
             row.remote_name]  # fmt: skip
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def mcp_tool_spec(row: McpTool) -> ToolSpec:
    server = row.server
    return ToolSpec(
        name=row.name,
        system=server.name,
        tool_class=row.tool_class,
        reversibility=row.reversibility or "",
        arguments=OpenResult,
        result=OpenResult,
        execute=partial(_execute, row),
        timeout_seconds=server.timeout_seconds,
        secrets=_server_secrets(server),
        description=row.description or f"{row.remote_name} on the MCP server {server.name}",
        module=f"MCP server {server.id} of project {server.project_id}",
        cut_off=True,
        parameters=row.input_schema or {"type": "object"},
        project_id=server.project_id,
        kind="mcp",
        classified=False,  # until a project admin confirms a class (tools/catalog.py)
        declaration=mcp_tool_declaration(row),
        on_refusal=server.on_refusal,
    )


def mcp_tool_find(name: str, project_id: int) -> ToolSpec | None:
    row = (
        McpTool.objects.filter(name=name, server__project_id=project_id, server__enabled=True)
        .select_related("server")
        .first()
    )
    return mcp_tool_spec(row) if row is not None else None
