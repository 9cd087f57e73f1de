"""A ticketing MCP server for the refunds example and the MCP tool tests, on the official SDK.

    python examples/refunds/tickets_mcp.py                  # stdio
    python examples/refunds/tickets_mcp.py --http 8702      # streamable HTTP on 127.0.0.1:8702/mcp

Its tools carry MCP annotations as a real server's would: search_tickets is read-only, add_comment is
idempotent, create_ticket says nothing (Warden treats it as a non-idempotent irreversible write). Every
effect is appended to $TICKETS_EFFECTS (a JSON line with the idempotency key Warden sent in _meta,
whether the server was given its credential, $TICKETS_TOKEN, and the server's process id). With
$TICKETS_CALLS set, every call that reaches it (reads too) is appended there, with its tool and key: what a
test counts as having left Warden."""

import argparse
import json
import os
import threading
import uuid

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

server = MCPServer("tickets")
_lock = threading.Lock()


def _effects_path() -> str:
    return os.environ.get("TICKETS_EFFECTS", "")


def _effects() -> list[dict]:
    path = _effects_path()
    if not path or not os.path.exists(path):
        return []
    with open(path) as source:
        return [json.loads(line) for line in source if line.strip()]


def _key(ctx: Context) -> str:
    meta = ctx.request_context.meta or {}
    return (meta.get("io.warden/idempotency-key") if isinstance(meta, dict) else getattr(meta, "model_extra", {}).get(
        "io.warden/idempotency-key")) or ""  # fmt: skip


def _record(kind: str, ctx: Context, **fields) -> None:
    path = _effects_path()
    if path:
        with _lock, open(path, "a") as out:
            out.write(json.dumps({"effect": kind, "key": _key(ctx), "pid": os.getpid(), **fields}) + "\n")


def _called(tool: str, ctx: Context) -> None:
    path = os.environ.get("TICKETS_CALLS", "")
    if path:
        with _lock, open(path, "a") as out:
            out.write(json.dumps({"tool": tool, "key": _key(ctx)}) + "\n")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def search_tickets(query: str, ctx: Context) -> dict:
    """Find tickets whose title contains the query."""
    _called("search_tickets", ctx)
    hits = [e for e in _effects() if e["effect"] == "create" and query.lower() in e["title"].lower()]
    return {"tickets": [{"id": e["id"], "title": e["title"]} for e in hits][:20]}


@server.tool()
def create_ticket(title: str, ctx: Context, body: str = "") -> dict:
    """Open a ticket."""
    _called("create_ticket", ctx)
    token = os.environ.get("TICKETS_TOKEN", "")
    if title == "quote":  # a careless server quoting its credential in an error
        raise ToolError(f"refused: token {token} may not open tickets")
    ticket = {"id": f"TCK-{uuid.uuid4().hex[:6]}", "title": title[:200]}
    _record("create", ctx, body=body[:500], authorised=bool(token), **ticket)
    return ticket


@server.tool(annotations=ToolAnnotations(idempotentHint=True, destructiveHint=False))
def add_comment(ticket_id: str, text: str, ctx: Context) -> dict:
    """Add a comment to a ticket (the same comment twice is kept once)."""
    _called("add_comment", ctx)
    if not any(e["effect"] == "comment" and (e["ticket_id"], e["text"]) == (ticket_id, text[:500]) for e in _effects()):
        _record("comment", ctx, ticket_id=ticket_id, text=text[:500])
    return {"ticket_id": ticket_id, "commented": True}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=0, help="serve streamable HTTP on this port")
    options = parser.parse_args()
    if options.http:
        server.run("streamable-http", host="127.0.0.1", port=options.http)
    else:
        server.run()
