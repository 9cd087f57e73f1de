"""Approval requests' creation and withdrawal, and the policies a run starts under. The broker and the
engine call these directly, inside their own transactions (so no operation waits for a request that does
not exist); what reviewers are told about a new request is the approvals app's work, asked for in the same
transaction through ``core.hooks.APPROVAL_REQUESTED``."""

import hashlib
import json

from django.db.models import Q
from django.utils import timezone

from core import bus, hooks

from .models import ApprovalPolicy, ApprovalRequest
from .transitions import APPROVAL_REQUEST
from .verdicts import Verdict, strictest


def _describe(op) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in (op.arguments or {}).items())
    owner = f"{op.task.key} " if op.task_id else ""
    return f"{owner}{op.tool}({args})"[:1000]


def _items_hash(hashes) -> str:
    return hashlib.sha256("|".join(hashes).encode()).hexdigest()


def request_terms(verdict: Verdict, *, with_expiry: bool) -> dict:
    """What a request asks for, from the gate's verdict. Items of a bundle have no expiry of their own:
    their parent carries the soonest."""
    terms = {
        "quorum": max(1, verdict.quorum),
        "admins_only": verdict.admins_only,
        "fail_on_reject": verdict.fail_on_reject,
    }
    if with_expiry:
        policy = ApprovalPolicy.objects.filter(id=verdict.expiry_policy).first() if verdict.expiry_policy else None
        seconds = verdict.expires_after
        terms["policy"] = policy
        terms["expires_at"] = timezone.now() + timezone.timedelta(seconds=seconds) if seconds else None
    return terms


def approval_request_for_operation(op, *, parent: ApprovalRequest | None = None, requested_by_id: int | None = None):
    """One call (a tools.ToolOperation) waits for a reviewer, on the terms of the verdict stored on it
    (quorum, admins only, expiry, what a rejection does). Inside the intent's (or the bundle's)
    transaction. ``requested_by_id``: whose action asked for the call (the run's starter, or the operator
    who compensated); they may not decide it."""
    bus.run_changed(op.run_id)
    request = ApprovalRequest.objects.create(
        run_id=op.run_id,
        task_id=op.task_id if op.kind == "action" and not op.proposed else None,
        parent=parent,
        kind=ApprovalRequest.Kind.OPERATION,
        summary=_describe(op),
        arguments_hash=op.arguments_hash,
        declaration=op.declaration or "",
        requested_by_id=requested_by_id,
        **request_terms(Verdict.from_json(op.verdict), with_expiry=parent is None),
    )
    type(op).objects.filter(id=op.id).update(approval=request)
    op.approval = request
    if parent is None:
        hooks.call(hooks.APPROVAL_REQUESTED, request)
    return request


def approval_request_for_operations(
    *, run, operations, kind: str, title: str, requested_by_id: int | None = None
) -> ApprovalRequest:
    """A parent request for several operations (a bundle of proposals, or the corrections of a
    compensation), with one item per operation that can also be decided alone. The parent asks for the
    strictest of its items' verdicts: the largest quorum, admins only if any item is, the soonest expiry,
    a failed task on rejection if any item says so."""
    bus.run_changed(run.id)
    lines = [title] + [f"{n}. {_describe(op)}" for n, op in enumerate(operations, 1)]
    parent = ApprovalRequest.objects.create(
        run=run,
        kind=kind,
        summary="\n".join(lines),
        arguments_hash=_items_hash(op.arguments_hash for op in operations),
        requested_by_id=requested_by_id,
        **request_terms(strictest(Verdict.from_json(op.verdict) for op in operations), with_expiry=True),
    )
    for op in operations:
        approval_request_for_operation(op, parent=parent, requested_by_id=requested_by_id)
    hooks.call(hooks.APPROVAL_REQUESTED, parent)
    return parent


def approvals_withdraw(*, run_id: int, reason: str, now) -> list[int]:
    """The run moved on (cancelled, compensated): nobody needs to decide its pending requests any more.
    Returns their ids (the caller settles the calls they were about). Run locked."""
    pending = ApprovalRequest.objects.filter(run_id=run_id, status=ApprovalRequest.Status.PENDING)
    ids = list(pending.values_list("id", flat=True))
    APPROVAL_REQUEST.move_where(pending, ApprovalRequest.Status.WITHDRAWN, decided_at=now, note=reason[:1000])
    return ids


def approvals_withdraw_ids(*, ids: list[int], reason: str, now) -> int:
    """Withdraw these pending requests: the calls they were about will not be made (a retry from an
    earlier step superseded them). The caller holds the run's lock."""
    pending = ApprovalRequest.objects.filter(id__in=ids)
    return APPROVAL_REQUEST.move_where(pending, ApprovalRequest.Status.WITHDRAWN, decided_at=now, note=reason[:1000])


def policies_in_force(*, project_id: int, workflow_id: int | None) -> list[dict]:
    """The enabled approval policies that may match a run starting now, each with its settings and their
    digest: recorded on the run (its ``versions``), so a later edit shows as a different digest and the
    gate can hold the run to the stricter of the recorded and the live settings."""
    rows = (
        ApprovalPolicy.objects.filter(enabled=True)
        .filter(Q(project_id=project_id) | Q(project__isnull=True))
        .filter(Q(workflow_id=workflow_id) | Q(workflow__isnull=True))
        .order_by("id")
        .values()
    )
    in_force = []
    for row in rows:
        settings_of = {k: v for k, v in row.items() if k not in ("id", "name")}
        digest = hashlib.sha256(json.dumps(settings_of, sort_keys=True, default=str).encode()).hexdigest()[:16]
        # The settings themselves too: the gate holds the run to the stricter of them and the live row
        # (a policy loosened or removed mid-run still binds it; a waiver added since does not).
        recorded = {k: row[k] for k in ApprovalPolicy.RECORDED}
        in_force.append({"id": row["id"], "name": row["name"], "digest": digest, "settings": recorded})
    return in_force
