"""Typed tools: arguments and result as pydantic models, a class, a reversibility and what undoes or
corrects an effect. The registry is trusted configuration; what a model asks for is checked against it."""

from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from . import sandbox

SECRET = {"secret": True}  # json_schema_extra of an argument field that must never be shown
REDACTED = "[secret]"


class ToolClass:
    READ_ONLY = "read_only"
    IDEMPOTENT_WRITE = "idempotent_write"
    NON_IDEMPOTENT_WRITE = "non_idempotent_write"


class Reversibility:
    NONE = ""
    REVERSIBLE = "reversible"
    IRREVERSIBLE = "irreversible"


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Result(BaseModel):
    model_config = ConfigDict(extra="ignore")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    system: str
    tool_class: str
    reversibility: str
    arguments: type[BaseModel]
    result: type[BaseModel]
    # execute(validated_args_dict, key=..., logged=..., fault=..., deadline=...) -> dict
    execute: Callable[..., dict]
    # Status lookup by idempotency key, for reconciling an ambiguous write; None when the system has none.
    lookup: Callable[[str], dict | None] | None = None
    # For a reversible write, the undo; for an irreversible one, the correction: (arguments, result) -> (tool, args)
    undo: Callable[[dict, dict], tuple[str, dict]] | None = None
    cacheable: bool = False  # a read whose result may be reused within a run
    timeout_seconds: float = 10.0
    rate_per_minute: int | None = None
    internal: bool = False  # used by the engine (compensations); not for agents' allowlists
    description: str = ""
    secret_fields: frozenset = field(default=frozenset())

    @property
    def is_write(self) -> bool:
        return self.tool_class != ToolClass.READ_ONLY


def _secret_fields(model: type[BaseModel]) -> frozenset:
    return frozenset(name for name, info in model.model_fields.items() if (info.json_schema_extra or {}).get("secret"))


def redact(spec: ToolSpec, arguments: dict) -> dict:
    """The arguments with secret fields replaced; safe for spans, the ledger, logs, pages and the API."""
    if not spec.secret_fields or not isinstance(arguments, dict):
        return arguments
    return {k: (REDACTED if k in spec.secret_fields and v is not None else v) for k, v in arguments.items()}


# --- argument and result models ------------------------------------------------------------------


class DeploymentsReadArgs(_Args):
    service: str = Field(min_length=1, max_length=100)


class DeploymentsReadResult(_Result):
    service: str
    version: str
    pods: int
    region: str


class CrmReadArgs(_Args):
    customer_id: str = Field(min_length=1, max_length=64, pattern=r"^[-a-zA-Z0-9_]+$")


class CrmReadResult(_Result):
    customer_id: str
    name: str
    tier: str
    fields: dict[str, str]


class SearchQueryArgs(_Args):
    query: str = Field(min_length=1, max_length=500)
    limit: int = Field(default=5, ge=1, le=20)


class SearchHit(_Result):
    title: str
    snippet: str


class SearchQueryResult(_Result):
    query: str
    hits: list[SearchHit]


class TicketsCreateArgs(_Args):
    customer_id: str = Field(min_length=1, max_length=64, pattern=r"^[-a-zA-Z0-9_]+$")
    title: str = Field(min_length=1, max_length=200)
    # Some trackers take a per-request credential in the body; it is passed on and never shown.
    api_key: str | None = Field(default=None, max_length=200, json_schema_extra=SECRET)


class TicketResult(_Result):
    ticket_id: str
    status: str


class TicketsCloseArgs(_Args):
    ticket_id: str = Field(min_length=1, max_length=32)
    reason: str = Field(default="", max_length=500)


class CrmUpdateArgs(_Args):
    customer_id: str = Field(min_length=1, max_length=64, pattern=r"^[-a-zA-Z0-9_]+$")
    fields: dict[str, str] = Field(min_length=1, max_length=50)


class CrmChangeResult(_Result):
    customer_id: str
    version: int
    before: dict[str, str | None]
    updated: list[str]


class CrmRestoreArgs(_Args):
    customer_id: str = Field(min_length=1, max_length=64)
    before: dict[str, str | None] = Field(min_length=1, max_length=50)


class EmailSendArgs(_Args):
    to: str = Field(min_length=3, max_length=200, pattern=r"^[^@\s]+@[^@\s]+$")
    subject: str = Field(min_length=1, max_length=200)
    body: str = Field(max_length=10_000)
    in_reply_to: str = Field(default="", max_length=64)


class EmailSendResult(_Result):
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
    return ToolSpec(secret_fields=_secret_fields(kwargs["arguments"]), **kwargs)


def _call(function):
    """Adapt a sandbox function to the broker's calling convention."""

    def execute(arguments: dict, *, key: str, logged: dict, fault=None, deadline=None) -> dict:
        return function(**arguments, key=key, logged=logged, fault=fault, deadline=deadline)

    return execute


TOOLS: dict[str, ToolSpec] = {
    spec.name: spec
    for spec in [
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
            system="tickets",
            tool_class=ToolClass.IDEMPOTENT_WRITE,
            reversibility=Reversibility.REVERSIBLE,
            arguments=TicketsCreateArgs,
            result=TicketResult,
            execute=_call(sandbox.tickets_create),
            lookup=sandbox.tickets_create_lookup,
            undo=_close_ticket,
            description="Open a ticket (undone by closing it)",
        ),
        _spec(
            name="tickets.close",
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
            system="crm",
            tool_class=ToolClass.IDEMPOTENT_WRITE,
            reversibility=Reversibility.REVERSIBLE,
            arguments=CrmUpdateArgs,
            result=CrmChangeResult,
            execute=_call(sandbox.crm_update),
            lookup=sandbox.crm_change_lookup,
            undo=_restore_record,
            description="Update fields of a CRM record (undone by restoring the before-image)",
        ),
        _spec(
            name="crm.restore",
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
            system="email",
            tool_class=ToolClass.NON_IDEMPOTENT_WRITE,
            reversibility=Reversibility.IRREVERSIBLE,
            arguments=EmailSendArgs,
            result=EmailSendResult,
            execute=_call(sandbox.email_send),
            lookup=sandbox.email_lookup,
            undo=_correction_email,
            description="E-mail a customer (irreversible: corrected by a correction e-mail)",
        ),
    ]
}
