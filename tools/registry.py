"""Typed stand-in tools over sandbox systems. Each call is a SandboxCall row, so effects can be
counted from outside the engine. (The full broker and ledger come with the tools issue.)"""

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, Field

from .models import SandboxCall


class ToolClass:
    READ_ONLY = "read_only"
    IDEMPOTENT_WRITE = "idempotent_write"
    NON_IDEMPOTENT_WRITE = "non_idempotent_write"


@dataclass(frozen=True)
class ToolSpec:
    name: str
    system: str
    tool_class: str
    reversible: bool
    arguments: type[BaseModel]
    run: Callable[[BaseModel, str], dict]
    # Status lookup by idempotency key, for reconciling an ambiguous write; None when the system has none.
    lookup: Callable[[str], dict | None] | None = None
    honours_keys: bool = False


def _record(spec_name: str, system: str, operation: str, key: str, args: BaseModel, result: dict, effect: bool):
    SandboxCall.objects.create(
        system=system,
        operation=operation,
        tool=spec_name,
        idempotency_key=key,
        is_effect=effect,
        arguments=args.model_dump(),
        result=result,
    )
    return result


def _short_id(prefix: str, key: str) -> str:
    return f"{prefix}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def _prior_effect(tool: str, key: str) -> dict | None:
    row = SandboxCall.objects.filter(tool=tool, idempotency_key=key, is_effect=True).order_by("id").first()
    return None if row is None else row.result


class DeploymentsReadArgs(BaseModel):
    service: str = Field(min_length=1, max_length=100)


def _deployments_read(args, key):
    result = {"service": args.service, "version": "v43", "pods": 12, "region": "eu-west-1"}
    return _record("deployments.read", "deployments", "read", key, args, result, effect=False)


class CrmReadArgs(BaseModel):
    customer_id: str = Field(min_length=1, max_length=64)


def _crm_read(args, key):
    result = {"customer_id": args.customer_id, "name": f"Customer {args.customer_id}", "tier": "gold"}
    return _record("crm.read", "crm", "read", key, args, result, effect=False)


class TicketsCreateArgs(BaseModel):
    customer_id: str = Field(min_length=1, max_length=64)
    title: str = Field(min_length=1, max_length=200)


def _tickets_create(args, key):
    prior = _prior_effect("tickets.create", key)
    if prior is not None:  # the tracker honours idempotency keys
        return prior
    result = {"ticket_id": _short_id("T", key), "status": "open"}
    return _record("tickets.create", "tickets", "create", key, args, result, effect=True)


class CrmUpdateArgs(BaseModel):
    customer_id: str = Field(min_length=1, max_length=64)
    fields: dict[str, str]


def _crm_update(args, key):
    prior = _prior_effect("crm.update", key)
    if prior is not None:
        return prior
    result = {"customer_id": args.customer_id, "updated": sorted(args.fields), "before": {"status": "active"}}
    return _record("crm.update", "crm", "update", key, args, result, effect=True)


class EmailSendArgs(BaseModel):
    to: str = Field(min_length=3, max_length=200)
    subject: str = Field(min_length=1, max_length=200)
    body: str = Field(max_length=10_000)


def _email_send(args, key):
    # The e-mail service does not honour idempotency keys: a blind retry sends a second e-mail.
    result = {"message_id": _short_id("M", key + str(SandboxCall.objects.filter(tool="email.send").count()))}
    return _record("email.send", "email", "send", key, args, result, effect=True)


TOOLS: dict[str, ToolSpec] = {
    spec.name: spec
    for spec in [
        ToolSpec("deployments.read", "deployments", ToolClass.READ_ONLY, True, DeploymentsReadArgs, _deployments_read),
        ToolSpec("crm.read", "crm", ToolClass.READ_ONLY, True, CrmReadArgs, _crm_read),
        ToolSpec(
            "tickets.create",
            "tickets",
            ToolClass.IDEMPOTENT_WRITE,
            True,
            TicketsCreateArgs,
            _tickets_create,
            lookup=lambda key: _prior_effect("tickets.create", key),
            honours_keys=True,
        ),
        ToolSpec(
            "crm.update",
            "crm",
            ToolClass.IDEMPOTENT_WRITE,
            True,
            CrmUpdateArgs,
            _crm_update,
            lookup=lambda key: _prior_effect("crm.update", key),
            honours_keys=True,
        ),
        ToolSpec(
            "email.send",
            "email",
            ToolClass.NON_IDEMPOTENT_WRITE,
            False,
            EmailSendArgs,
            _email_send,
            lookup=lambda key: _prior_effect("email.send", key),
        ),
    ]
}


def canonical_hash(name: str, arguments) -> str:
    return hashlib.sha256(json.dumps([name, arguments], sort_keys=True, default=str).encode()).hexdigest()
