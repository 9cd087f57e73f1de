"""The audit log's one writer."""

import logging

from .models import AuditEvent

log = logging.getLogger("warden.audit")


def _address(request) -> str | None:
    if request is None:
        return None
    return request.META.get("REMOTE_ADDR") or None


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
        address=_address(request),
    )
    log.info("audit: %s %s %s (%s)", event.actor_label or "system", action, target, outcome)
    return event
