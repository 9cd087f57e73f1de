"""The audit log's one writer."""

import ipaddress
import logging
from contextlib import contextmanager

from django.conf import settings
from django.db import transaction

from core.errors import Conflict
from core.machine import TransitionNotAllowed

from .models import AuditEvent

log = logging.getLogger("warden.audit")


def client_address(request) -> str | None:
    """The client's address: REMOTE_ADDR, or behind ``WARDEN_TRUSTED_PROXY_COUNT`` reverse proxies the
    entry that many from the right of the header they fill (each proxy appends the address it got the
    request from; entries further left are whatever the client sent, and are never believed). Used by
    the audit log and by the login lockout (django-axes)."""
    if request is None:
        return None
    remote = request.META.get("REMOTE_ADDR") or None
    count = settings.WARDEN["TRUSTED_PROXY_COUNT"]
    if not count:
        return remote
    entries = [e.strip() for e in request.META.get(settings.WARDEN["CLIENT_IP_HEADER"], "").split(",") if e.strip()]
    if len(entries) < count:
        return remote  # the request did not come through the proxies as configured
    try:
        return str(ipaddress.ip_address(entries[-count]))
    except ValueError:
        return remote


def audit(
    *,
    actor,
    action: str,
    target: str = "",
    outcome: str = "done",
    project_id: int | None = None,
    run=None,
    run_id: int | None = None,
    detail: dict | None = None,
    request=None,
    via: str = "",
) -> AuditEvent:
    """Record who did (or tried) what. ``detail`` holds hashes and reasons, never secrets."""
    if run is not None and project_id is None:
        project_id = run.project_id
    if not via and request is not None:
        via = "api" if request.path.startswith("/api/") else "admin" if request.path.startswith("/admin/") else "page"
    user = actor if getattr(actor, "pk", None) else None
    event = AuditEvent.objects.create(
        actor=user,
        actor_label=user.get_username() if user else "",
        via=via or "system",
        action=action,
        outcome=outcome,
        project_id=project_id,
        run_id=run.id if run is not None else run_id,
        target=target[:200],
        detail=detail or {},
        address=client_address(request),
    )
    log.info("audit: %s %s %s (%s)", event.actor_label or "system", action, target, outcome)
    return event


def audit_denied(*, actor, action: str, target: str, request, refusal: Exception, run=None) -> AuditEvent:
    """A person's refused attempt (a decision, an answer), recorded after the refusal rolled back its
    transaction, so that the row stays."""
    return audit(actor=actor, action=action, outcome="denied", run=run, target=target, request=request,
                 detail={"why": str(refusal)})  # fmt: skip


# A service's refusals: recorded as denied, after its transaction rolled back (so that the row stays).
REFUSALS = (Conflict, TransitionNotAllowed)


@contextmanager
def audited(action: str, *, actor, via: str = "", request=None, target: str, run_id=None, project_id=None, detail=None):
    """The transaction of a service that records its own outcome: one audit row, ``done`` inside the
    transaction it commits with, or ``denied`` (with why) after a refusal rolled it back. The service
    fills in what it learns under its lock (``project_id``, more ``detail``); callers never audit.
    A call with neither actor nor via (the engine acting on its own) is not audited."""
    record = {"target": target, "run_id": run_id, "project_id": project_id, "detail": dict(detail or {})}
    who = {"actor": actor, "via": via, "request": request}
    acting = actor is not None or bool(via)
    try:
        with transaction.atomic():
            yield record
            if acting:
                audit(action=action, **who, **record)
    except REFUSALS as exc:
        if acting:
            record["detail"] = {**record["detail"], "why": str(exc)[:1000]}
            audit(action=action, outcome="denied", **who, **record)
        raise
