"""Deciding a change request (tenancy/governance.py): another admin of the project, never its author,
approves it (and the change applies, as the decider's act) or rejects it with a reason. The reviewer
queue, the inbox, the API and the admin all decide through ``change_request_decide``."""

import logging

from django.db import transaction
from django.utils import timezone

from core.errors import Conflict, Forbidden, InvalidInput, NotFound
from tenancy.access import authorize, project_ids, role_of
from tenancy.audit import audit, audit_denied
from tenancy.governance import CHANGE_REQUEST
from tenancy.models import ChangeRequest
from tools.classifications import SUBJECT as CLASSIFICATION
from tools.classifications import classification_change_apply
from tools.governance import declaration_change_apply, declaration_change_preview
from tools.kit import ToolRefused
from tools.mcp_tools import McpUnreachable, mcp_server_list

from .policies import SUBJECT as POLICY
from .policies import policy_change_apply

log = logging.getLogger("warden.governance")
CS = ChangeRequest.Status


def change_requests_pending(user, *, project=None):
    """Pending change requests of the projects ``user`` administers (all of them for a superuser)."""
    rows = ChangeRequest.objects.filter(status=CS.PENDING).select_related("project", "requested_by")
    allowed = project_ids(user, "administer")
    rows = rows if allowed is None else rows.filter(project_id__in=allowed)
    rows = rows.filter(project=project) if project is not None else rows
    return rows.order_by("requested_at", "id")


def change_request_refusal(change: ChangeRequest, user) -> Forbidden | None:
    """Why ``user`` may not decide this request (None when they may); the role is checked before."""
    if change.requested_by_id == getattr(user, "pk", None):
        return Forbidden("four eyes: whoever asked for a change cannot approve or reject it; another admin decides")
    if role_of(user, change.project_id) != "admin":
        return Forbidden("only an admin of the project decides a change of its rules")
    return None


def change_request_decide(*, request_id: int, user, approve: bool, note: str = "", token=None, request=None):
    """Approve (the change applies now, as ``user``'s act) or reject (with a reason) a pending request."""
    change = ChangeRequest.objects.filter(id=request_id).first()
    if change is None:
        raise NotFound(f"change request {request_id} does not exist")
    authorize(user, change.project_id, "administer", what=f"change request {request_id}", token=token,
              request=request)  # fmt: skip
    target = f"change request {request_id}"
    try:
        listed = _listing(change, user, request) if approve else None
        with transaction.atomic():
            change = ChangeRequest.objects.select_for_update().get(id=request_id)
            _check(change, user, approve, note)
            if approve:
                _apply(change, user, listed, request)
            CHANGE_REQUEST.move(change, CS.APPLIED if approve else CS.REJECTED, decided_by=user,
                                decided_at=timezone.now(), note=note[:2000])  # fmt: skip
            audit(actor=user, action=f"change_request_{'approve' if approve else 'reject'}",
                  project_id=change.project_id, target=target, request=request,
                  detail={"label": change.label, "note": note[:1000], "loosens": change.loosens})  # fmt: skip
    except Conflict as exc:
        if "changed since" in str(exc) or "made meanwhile" in str(exc):
            _stale(request_id, str(exc))
        audit_denied(actor=user, action="change_request_decide", target=target, request=request, refusal=exc)
        raise
    except (Forbidden, InvalidInput) as exc:
        audit_denied(actor=user, action="change_request_decide", target=target, request=request, refusal=exc)
        raise
    return change


def _check(change: ChangeRequest, user, approve: bool, note: str) -> None:
    if change.status != CS.PENDING:
        raise Conflict(f"change request {change.id} is {change.status}; it cannot be decided again")
    refusal = change_request_refusal(change, user)
    if refusal is not None:
        raise refusal
    if not approve and not note.strip():
        raise InvalidInput("a rejection needs a reason", [{"field": "note", "message": "required to reject"}])


def _listing(change: ChangeRequest, user, request):
    """An MCP server's new address is asked for its tools before its change applies, outside any
    transaction and audited as the decider's act: what does not answer is not applied."""
    if change.subject != "tools.mcpserver" or change.status != CS.PENDING:
        return None
    server = declaration_change_preview(change)
    if server is None:
        return None  # stale: the transaction says so
    try:
        return mcp_server_list(server=server, user=user, request=request)
    except (McpUnreachable, ToolRefused) as exc:
        raise Conflict(f"the MCP server at its new address cannot be listed: {str(exc)[:300]}") from exc


def _apply(change: ChangeRequest, user, listed, request) -> None:
    if change.subject in ("tools.httptool", "tools.mcpserver"):
        declaration_change_apply(change=change, user=user, listed=listed, request=request)
    elif change.subject == CLASSIFICATION:
        classification_change_apply(change=change, user=user, request=request)
    elif change.subject == POLICY:
        policy_change_apply(change=change, user=user, request=request)
    else:
        raise Conflict(f"change request {change.id} is about {change.subject}, which cannot be changed this way")


def _stale(request_id: int, why: str) -> None:
    with transaction.atomic():
        change = ChangeRequest.objects.select_for_update().get(id=request_id)
        if change.status == CS.PENDING:
            CHANGE_REQUEST.move(change, CS.STALE, decided_at=timezone.now(), note=why[:2000])
    log.info("change request %s is stale: %s", request_id, why)
