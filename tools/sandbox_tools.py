"""The sandbox systems as tools: a ticket tracker, a CRM, an e-mail service, a deployment inventory and a
search index (tools/sandbox.py), declared for the demos and the drills like any team's tool module.
Loaded when WARDEN_SANDBOX_TOOLS is on (the default, not in production settings)."""

import os

from pydantic import Field

from . import sandbox
from .kit import (
    SECRET,
    Reversibility,
    ToolArguments,
    ToolClass,
    ToolMisconfigured,
    ToolResult,
    ToolSpec,
    declare,
    secret_fields,
)

# --- argument and result models ------------------------------------------------------------------


class DeploymentsReadArgs(ToolArguments):
    service: str = Field(min_length=1, max_length=100)


class DeploymentsReadResult(ToolResult):
    service: str
    version: str
    pods: int
    region: str


class CrmReadArgs(ToolArguments):
    customer_id: str = Field(min_length=1, max_length=64, pattern=r"^[-a-zA-Z0-9_]+$")


class CrmReadResult(ToolResult):
    customer_id: str
    name: str
    tier: str
    fields: dict[str, str]


class SearchQueryArgs(ToolArguments):
    query: str = Field(min_length=1, max_length=500)
    limit: int = Field(default=5, ge=1, le=20)


class SearchHit(ToolResult):
    title: str
    snippet: str


class SearchQueryResult(ToolResult):
    query: str
    hits: list[SearchHit]


class TicketsCreateArgs(ToolArguments):
    customer_id: str = Field(min_length=1, max_length=64, pattern=r"^[-a-zA-Z0-9_]+$")
    title: str = Field(min_length=1, max_length=200)
    # Deprecated: the tracker's credential is the named secret SANDBOX_TICKETS_API_KEY, which the broker
    # reads at call time; a model never needs to supply one. A value sent here is still sealed (never
    # shown) and is ignored by the tracker.
    api_key: str | None = Field(default=None, max_length=200, json_schema_extra=SECRET)


class TicketResult(ToolResult):
    ticket_id: str
    status: str


class TicketsCloseArgs(ToolArguments):
    ticket_id: str = Field(min_length=1, max_length=32)
    reason: str = Field(default="", max_length=500)


class CrmUpdateArgs(ToolArguments):
    customer_id: str = Field(min_length=1, max_length=64, pattern=r"^[-a-zA-Z0-9_]+$")
    fields: dict[str, str] = Field(min_length=1, max_length=50)


class CrmChangeResult(ToolResult):
    customer_id: str
    version: int
    before: dict[str, str | None]
    updated: list[str]


class CrmRestoreArgs(ToolArguments):
    customer_id: str = Field(min_length=1, max_length=64)
    before: dict[str, str | None] = Field(min_length=1, max_length=50)


class EmailSendArgs(ToolArguments):
    to: str = Field(min_length=3, max_length=200, pattern=r"^[^@\s]+@[^@\s]+$")
    subject: str = Field(min_length=1, max_length=200)
    body: str = Field(max_length=10_000)
    in_reply_to: str = Field(default="", max_length=64)


class EmailSendResult(ToolResult):
    message_id: str
    status: str


# --- undo and correction ------------------------------------------------------------------------


def _close_ticket(arguments: dict, result: dict) -> tuple[str, dict]:
    return "tickets.close", {"ticket_id": result["ticket_id"], "reason": "compensated: the run was rolled back"}


def _restore_record(arguments: dict, result: dict) -> tuple[str, dict]:
    return "crm.restore", {"customer_id": result["customer_id"], "before": result["before"]}


def _correction_email(arguments: dict, result: dict) -> tuple[str, dict]:
    return "email.send", {
        "to": arguments["to"],
        "subject": f"Correction: {arguments['subject']}"[:200],
        "body": "Please disregard our previous message: the action it described has been reversed.",
        "in_reply_to": result["message_id"],
    }


def _spec(**kwargs) -> ToolSpec:
    return declare(ToolSpec(secret_fields=secret_fields(kwargs["arguments"]), module=__name__, **kwargs))


def _call(function, credential: str = ""):
    """Adapt a sandbox function to the broker's calling convention (``credential``: the named secret the
    system checks, as a real tracker checks its API key)."""

    def execute(arguments: dict, *, key: str, logged: dict, fault=None, deadline=None, secrets=None) -> dict:
        if credential and not (secrets or {}).get(credential):
            raise ToolMisconfigured(f"the {function.__name__.split('_')[0]} system refused the request: no credential")
        return function(**arguments, key=key, logged=logged, fault=fault, deadline=deadline)

    return execute


# The demo tracker's key, named like a real one: set SANDBOX_TICKETS_API_KEY to use your own (the
# canary tests do); without it the demo's key is used, so the demos need nothing set.
TRACKER_KEY = "SANDBOX_TICKETS_API_KEY"
os.environ.setdefault(TRACKER_KEY, "sandbox-tracker-demo-key")


SANDBOX_TOOLS = [
    _spec(
        name="deployments.read",
        system="deployments",
        tool_class=ToolClass.READ_ONLY,
        reversibility=Reversibility.NONE,
        arguments=DeploymentsReadArgs,
        result=DeploymentsReadResult,
        execute=_call(sandbox.deployments_read),
        cacheable=True,
        description="What is deployed for a service",
    ),
    _spec(
        name="crm.read",
        system="crm",
        tool_class=ToolClass.READ_ONLY,
        reversibility=Reversibility.NONE,
        arguments=CrmReadArgs,
        result=CrmReadResult,
        execute=_call(sandbox.crm_read),
        description="A customer's CRM record",
        repeatable=True,  # a what-if replay that allows live reads may read a record again
    ),
    _spec(
        name="search.query",
        system="search",
        tool_class=ToolClass.READ_ONLY,
        reversibility=Reversibility.NONE,
        arguments=SearchQueryArgs,
        result=SearchQueryResult,
        execute=_call(sandbox.search_query),
        cacheable=True,
        rate_per_minute=120,
        description="Search runbooks and past incidents",
    ),
    _spec(
        name="tickets.create",
        external_id="ticket_id",
        undo_tool="tickets.close",
        system="tickets",
        tool_class=ToolClass.IDEMPOTENT_WRITE,
        reversibility=Reversibility.REVERSIBLE,
        arguments=TicketsCreateArgs,
        result=TicketResult,
        execute=_call(sandbox.tickets_create, credential=TRACKER_KEY),
        secrets=(TRACKER_KEY,),
        lookup=sandbox.tickets_create_lookup,
        undo=_close_ticket,
        replay_result={"ticket_id": "T-REPLAY", "status": "not opened (replay)"},
        description="Open a ticket (undone by closing it)",
    ),
    _spec(
        name="tickets.close",
        external_id="ticket_id",
        system="tickets",
        tool_class=ToolClass.IDEMPOTENT_WRITE,
        reversibility=Reversibility.IRREVERSIBLE,
        arguments=TicketsCloseArgs,
        result=TicketResult,
        execute=_call(sandbox.tickets_close),
        lookup=sandbox.tickets_close_lookup,
        internal=True,
        description="Close a ticket",
    ),
    _spec(
        name="crm.update",
        external_id="customer_id",
        undo_tool="crm.restore",
        system="crm",
        tool_class=ToolClass.IDEMPOTENT_WRITE,
        reversibility=Reversibility.REVERSIBLE,
        arguments=CrmUpdateArgs,
        result=CrmChangeResult,
        execute=_call(sandbox.crm_update),
        lookup=sandbox.crm_change_lookup,
        undo=_restore_record,
        replay_result={"customer_id": "", "version": 0, "before": {}, "updated": []},
        description="Update fields of a CRM record (undone by restoring the before-image)",
    ),
    _spec(
        name="crm.restore",
        external_id="customer_id",
        system="crm",
        tool_class=ToolClass.IDEMPOTENT_WRITE,
        reversibility=Reversibility.IRREVERSIBLE,
        arguments=CrmRestoreArgs,
        result=CrmChangeResult,
        execute=_call(sandbox.crm_restore),
        lookup=sandbox.crm_change_lookup,
        internal=True,
        description="Restore a CRM record's fields to a before-image",
    ),
    _spec(
        name="email.send",
        external_id="message_id",
        undo_tool="email.send",
        system="email",
        tool_class=ToolClass.NON_IDEMPOTENT_WRITE,
        reversibility=Reversibility.IRREVERSIBLE,
        arguments=EmailSendArgs,
        result=EmailSendResult,
        execute=_call(sandbox.email_send),
        lookup=sandbox.email_lookup,
        undo=_correction_email,
        replay_result={"message_id": "", "status": "not sent (replay)"},
        description="E-mail a customer (irreversible: corrected by a correction e-mail)",
    ),
]
