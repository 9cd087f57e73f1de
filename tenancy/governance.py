"""Four eyes on the rules themselves: a change that loosens a project's rules waits for a second admin.

What loosens is decided by the app that owns the row (tools/governance.py for tools, classifications, HTTP
tools and MCP servers; approvals/policies.py for approval policies and waivers); tightening applies at
once. Here: who must ask rather than act (``second_admin_needed``), and the request itself. Deciding it,
and applying what it asks for, belong to the reviewers' app (approvals/governance.py), which sees every
kind of row.

A superuser (the deployment's owner: setup commands, the demo, an emergency) changes at once, audited;
so does any admin of a project a superuser set to single-admin governance.
"""

import json

from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.utils import timezone

from core.errors import Conflict, NotFound
from core.machine import StateMachine

from .audit import audit
from .models import ChangeRequest, Project

CS = ChangeRequest.Status
CHANGE_REQUEST = StateMachine(
    "change request",
    CS.values,
    {
        CS.PENDING: frozenset({CS.APPLIED, CS.REJECTED, CS.WITHDRAWN, CS.STALE}),
        CS.APPLIED: frozenset(),
        CS.REJECTED: frozenset(),
        CS.WITHDRAWN: frozenset(),
        CS.STALE: frozenset(),
    },
)


def second_admin_needed(user, project_id: int) -> bool:
    """Must ``user``'s loosening change in this project wait for another admin?"""
    if user is not None and user.is_superuser:
        return False
    governance = Project.objects.filter(id=project_id).values_list("governance", flat=True).first()
    return governance != Project.Governance.SINGLE_ADMIN


def change_request_open(
    *,
    user,
    project_id: int,
    subject: str,
    object_id: int | None,
    action: str,
    label: str,
    before: dict,
    after: dict,
    loosens: list[str],
    request=None,
) -> ChangeRequest:
    """Record a loosening change for another admin of the project to decide; nothing else changes. The
    caller has checked that ``user`` may administer the project and that the change is valid. The same
    change asked for again by the same person while it waits (a declaration file applied by each CI run)
    is the request already open."""
    waiting = _same_request_pending(user, project_id, subject, object_id, action, before, after)
    if waiting is not None:
        return waiting
    with transaction.atomic():
        row = ChangeRequest.objects.create(
            project_id=project_id,
            subject=subject,
            object_id=object_id,
            action=action,
            label=label[:200],
            before=before,
            after=after,
            loosens=loosens,
            requested_by=user,
        )
        audit(
            actor=user,
            action="change_request_open",
            project_id=project_id,
            target=f"change request {row.id}: {label}"[:200],
            request=request,
            detail={
                "subject": subject,
                "object": object_id,
                "action": action,
                "before": before,
                "after": after,
                "loosens": loosens,
            },  # fmt: skip
        )
    return row


def _same_request_pending(user, project_id, subject, object_id, action, before, after) -> ChangeRequest | None:
    def canonical(value) -> str:
        return json.dumps(value, sort_keys=True, cls=DjangoJSONEncoder)

    rows = ChangeRequest.objects.filter(
        project_id=project_id, subject=subject, object_id=object_id, action=action, status=CS.PENDING,
        requested_by=user,
    )  # fmt: skip
    for row in rows.order_by("id"):
        if canonical(row.before) == canonical(before) and canonical(row.after) == canonical(after):
            return row
    return None


def change_request_withdraw(*, request_id: int, user, request=None) -> ChangeRequest:
    """Its author takes a pending request back."""
    with transaction.atomic():
        row = ChangeRequest.objects.select_for_update().filter(id=request_id).first()
        if row is None:
            raise NotFound(f"change request {request_id} does not exist")
        if row.requested_by_id != getattr(user, "pk", None):
            raise Conflict("only whoever asked for a change withdraws it; another admin rejects it, with a reason")
        if row.status != CS.PENDING:
            raise Conflict(f"change request {row.id} is {row.status}; only a pending one can be withdrawn")
        CHANGE_REQUEST.move(row, CS.WITHDRAWN, decided_by=user, decided_at=timezone.now())
        audit(actor=user, action="change_request_withdraw", project_id=row.project_id,
              target=f"change request {row.id}", request=request)  # fmt: skip
    return row
