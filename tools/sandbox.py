"""Sandbox external systems: a ticket tracker, a CRM, an e-mail service, a deployment inventory and a
search index, each in its own tables and its own transaction, as another company's service would be.

They behave as the real kinds do: the tracker and the CRM honour idempotency keys; the e-mail service
does not (a repeated send is a second e-mail) but can be searched by the key it carried as a header.
Every call takes a drill ``fault``: ``error`` (refused, nothing changes), ``transient`` (try again,
nothing changes), ``timeout_after_commit`` (the change is made, then the answer is lost) and ``slow``
(the answer comes late; past the caller's deadline nothing changes and the caller times out).
"""

import hashlib
import time

from django.db import transaction
from django.utils import timezone

from .kit import ToolRefused, ToolTimeout, ToolUnavailable
from .models import (
    SandboxCall,
    SandboxDeployment,
    SandboxDocument,
    SandboxEmail,
    SandboxRecord,
    SandboxRecordChange,
    SandboxTicket,
)

SLOW_SECONDS = 0.5
SEARCH_SEED = [
    ("Checkout runbook", "Roll back with the deploy tool; page the on-call."),
    ("Incident 2031", "Checkout timeouts after a schema migration."),
    ("Customer comms", "E-mail affected customers within one hour."),
]


class SystemError_(ToolRefused):
    """The system refused the request; nothing changed."""


class SystemTransient(ToolUnavailable):
    """The system is briefly unavailable; nothing changed."""


class SystemTimeout(ToolTimeout):
    """No answer before the deadline: the change may or may not have been made."""


def _short_id(prefix: str, *parts: str) -> str:
    return f"{prefix}-{hashlib.sha256(':'.join(parts).encode()).hexdigest()[:10]}"


def _before_call(system: str, fault: str | None, deadline: float | None) -> None:
    if fault == "error":
        raise SystemError_(f"the {system} system refused the request (drill fault)")
    if fault == "transient":
        raise SystemTransient(f"the {system} system is briefly unavailable (drill fault)")
    if fault == "slow":
        if deadline is not None and deadline < SLOW_SECONDS:
            time.sleep(max(0.0, deadline))
            raise SystemTimeout(f"the {system} system did not answer within {deadline:.1f}s (drill fault)")
        time.sleep(SLOW_SECONDS)


def _after_commit(system: str, fault: str | None) -> None:
    if fault == "timeout_after_commit":
        raise SystemTimeout(f"the {system} system timed out after it committed (drill fault)")


def _log(tool: str, key: str, logged: dict, result: dict, *, effect: bool, object_id="", operation="") -> None:
    """One request served: the system and operation are the tool's name (`tickets.create`)."""
    system, _, default_operation = tool.partition(".")
    SandboxCall.objects.create(
        system=system,
        operation=operation or default_operation,
        tool=tool,
        idempotency_key=key,
        is_effect=effect,
        object_id=object_id,
        arguments=logged,
        result=result,
    )


def _record(customer_id: str) -> SandboxRecord:
    record, _ = SandboxRecord.objects.get_or_create(
        customer_id=customer_id, defaults={"name": f"Customer {customer_id}", "fields": {"status": "active"}}
    )
    return record


# --- reads -------------------------------------------------------------------------------------


def deployments_read(*, service: str, key: str, logged: dict, fault=None, deadline=None) -> dict:
    _before_call("deployments", fault, deadline)
    if service == "checkout":  # the inventory knows the demo's service (get_or_create: concurrent first reads)
        SandboxDeployment.objects.get_or_create(
            service=service, defaults={"version": "v43", "pods": 12, "region": "eu-west-1"}
        )
    row = SandboxDeployment.objects.filter(service=service).first()
    if row is None:  # an unknown service is an empty answer, not an error
        result = {"service": service, "version": "", "pods": 0, "region": ""}
    else:
        result = {"service": row.service, "version": row.version, "pods": row.pods, "region": row.region}
    _log("deployments.read", key, logged, result, effect=False)
    return result


def crm_read(*, customer_id: str, key: str, logged: dict, fault=None, deadline=None) -> dict:
    _before_call("crm", fault, deadline)
    record = _record(customer_id)
    result = {"customer_id": record.customer_id, "name": record.name, "tier": record.tier, "fields": record.fields}
    _log("crm.read", key, logged, result, effect=False)
    return result


def search_query(*, query: str, limit: int, key: str, logged: dict, fault=None, deadline=None) -> dict:
    _before_call("search", fault, deadline)
    for title, body in SEARCH_SEED:  # get_or_create: two first searches at once must not seed twice
        SandboxDocument.objects.get_or_create(title=title, defaults={"body": body})
    words = [w for w in query.lower().split() if w]
    hits = [
        {"title": d.title, "snippet": d.body[:200]}
        for d in SandboxDocument.objects.order_by("id")
        if any(w in (d.title + " " + d.body).lower() for w in words)
    ][:limit]
    result = {"query": query, "hits": hits}
    _log("search.query", key, logged, result, effect=False)
    return result


# --- tickets (honour keys) ---------------------------------------------------------------------


def _ticket_result(ticket: SandboxTicket) -> dict:
    return {"ticket_id": ticket.ticket_id, "status": ticket.status}


def tickets_create(*, customer_id: str, title: str, key: str, logged: dict, fault=None, deadline=None, **_) -> dict:
    _before_call("tickets", fault, deadline)
    with transaction.atomic():
        existing = SandboxTicket.objects.select_for_update().filter(idempotency_key=key).first()
        if existing is not None:  # a repeat of a request already served: same answer, no new ticket
            result = _ticket_result(existing)
            _log("tickets.create", key, logged, result, effect=False, object_id=existing.ticket_id)
        else:
            ticket = SandboxTicket.objects.create(
                ticket_id=_short_id("T", key), idempotency_key=key, customer_id=customer_id, title=title
            )
            result = _ticket_result(ticket)
            _log("tickets.create", key, logged, result, effect=True, object_id=ticket.ticket_id)
    _after_commit("tickets", fault)
    return result


def tickets_create_lookup(key: str) -> dict | None:
    ticket = SandboxTicket.objects.filter(idempotency_key=key).first()
    return None if ticket is None else _ticket_result(ticket)


def tickets_close(*, ticket_id: str, reason: str, key: str, logged: dict, fault=None, deadline=None) -> dict:
    _before_call("tickets", fault, deadline)
    with transaction.atomic():
        ticket = SandboxTicket.objects.select_for_update().filter(ticket_id=ticket_id).first()
        if ticket is None:
            raise SystemError_(f"the tracker has no ticket {ticket_id}")
        changed = ticket.status != "closed"
        if changed:
            ticket.status, ticket.closed_at, ticket.close_key = "closed", timezone.now(), key
            ticket.save(update_fields=["status", "closed_at", "close_key"])
        result = _ticket_result(ticket)
        _log("tickets.close", key, logged, result, effect=changed, object_id=ticket_id)
    _after_commit("tickets", fault)
    return result


def tickets_close_lookup(key: str) -> dict | None:
    ticket = SandboxTicket.objects.filter(close_key=key).first()
    return None if ticket is None else _ticket_result(ticket)


# --- CRM writes (honour keys) ------------------------------------------------------------------


def _change_result(change: SandboxRecordChange) -> dict:
    return {
        "customer_id": change.record.customer_id,
        "version": change.version,
        "before": change.before,
        "updated": sorted(change.after),
    }


def _change(*, kind: str, customer_id: str, values: dict, key: str, logged: dict, fault, deadline, tool) -> dict:
    _before_call("crm", fault, deadline)
    with transaction.atomic():
        existing = SandboxRecordChange.objects.select_related("record").filter(idempotency_key=key).first()
        if existing is not None:
            result = _change_result(existing)
            _log(tool, key, logged, result, effect=False, object_id=customer_id)
        else:
            _record(customer_id)
            record = SandboxRecord.objects.select_for_update().get(customer_id=customer_id)
            before = {name: record.fields.get(name) for name in values}
            for name, value in values.items():
                if value is None:
                    record.fields.pop(name, None)
                else:
                    record.fields[name] = value
            record.version += 1
            record.save(update_fields=["fields", "version"])
            change = SandboxRecordChange.objects.create(
                record=record, idempotency_key=key, kind=kind, before=before, after=values, version=record.version
            )
            result = _change_result(change)
            _log(tool, key, logged, result, effect=True, object_id=customer_id)
    _after_commit("crm", fault)
    return result


def crm_update(*, customer_id: str, fields: dict, **call) -> dict:
    return _change(kind="update", customer_id=customer_id, values=fields, tool="crm.update", **call)


def crm_restore(*, customer_id: str, before: dict, **call) -> dict:
    return _change(kind="restore", customer_id=customer_id, values=before, tool="crm.restore", **call)


def crm_change_lookup(key: str) -> dict | None:
    change = SandboxRecordChange.objects.select_related("record").filter(idempotency_key=key).first()
    return None if change is None else _change_result(change)


# --- e-mail (does not honour keys) ---------------------------------------------------------------


def email_send(
    *, to: str, subject: str, body: str, in_reply_to: str = "", key: str, logged: dict, fault=None, deadline=None
) -> dict:
    _before_call("email", fault, deadline)
    with transaction.atomic():
        number = SandboxEmail.objects.count() + 1
        mail = SandboxEmail.objects.create(
            message_id=_short_id("M", key, str(number), str(time.time_ns())),
            idempotency_key=key,
            to=to,
            subject=subject,
            body=body,
            kind="correction" if in_reply_to else "message",
            in_reply_to=in_reply_to,
        )
        result = {"message_id": mail.message_id, "status": "sent"}
        operation = "correction" if in_reply_to else "send"
        _log("email.send", key, logged, result, effect=True, object_id=mail.message_id, operation=operation)
    _after_commit("email", fault)
    return result


def email_lookup(key: str) -> dict | None:
    """Search the sent folder by the key header (the first match: later ones are duplicates)."""
    mail = SandboxEmail.objects.filter(idempotency_key=key).order_by("id").first()
    return None if mail is None else {"message_id": mail.message_id, "status": "sent"}
