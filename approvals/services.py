"""Approval requests: created by the broker and the saga engine, decided by people (admin or API).

A decision is applied under the run's lock (lock order: run, then tasks and operations) so that it can
race neither the task that is about to park nor another reviewer.
"""

import hashlib
import json
import logging

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from core import bus
from core.errors import Conflict, Forbidden, InvalidInput, NotFound
from runs.models import Run
from runs.saga import run_operations_send
from runs.services.runs import run_transition
from runs.webhooks import webhook_emit
from tenancy.access import role_of
from tenancy.audit import audit, audit_denied
from tools.broker import arguments_hash, operations_decided
from tools.catalog import tool_spec
from tools.gate import Origin, Verdict, gate, strictest
from tools.kit import ArgumentsInvalid
from tools.models import ToolOperation
from tools.registry import redact
from tools.transitions import OPERATION

from .models import ApprovalPolicy, ApprovalRequest
from .notify import notifications_add
from .questions import questions_withdraw
from .transitions import APPROVAL_REQUEST
from .wake import parked_task_wake

log = logging.getLogger("warden.approvals")


def _describe(op) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in (op.arguments or {}).items())
    owner = f"{op.task.key} " if op.task_id else ""
    return f"{owner}{op.tool}({args})"[:1000]


def _items_hash(hashes) -> str:
    import hashlib

    return hashlib.sha256("|".join(hashes).encode()).hexdigest()


def _terms(verdict: Verdict, *, with_expiry: bool) -> dict:
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
    """One call waits for a reviewer, on the terms of the verdict stored on it (quorum, admins only,
    expiry, what a rejection does). Inside the intent's (or the bundle's) transaction. ``requested_by_id``:
    whose action asked for the call (the run's starter, or the operator who compensated); they may not
    decide it."""
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
        **_terms(Verdict.from_json(op.verdict), with_expiry=parent is None),
    )
    type(op).objects.filter(id=op.id).update(approval=request)
    op.approval = request
    if parent is None:
        notifications_add(request, kind="new")
        _emit(request, "approval.requested")
    return request


def _emit(request: ApprovalRequest, event: str) -> None:

    project_id = Run.objects.filter(id=request.run_id).values_list("project_id", flat=True).first()
    data = {
        "request": request.id,
        "run": request.run_id,
        "kind": request.kind,
        "status": request.status,
        "summary": request.summary,
        "decided_by": request.decided_by.get_username() if request.decided_by_id else None,
        "note": request.note,
    }
    webhook_emit(event=event, project_id=project_id, data=data)


def approval_request_for_operations(
    *, run: Run, operations, kind: str, title: str, requested_by_id: int | None = None
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
        **_terms(strictest(Verdict.from_json(op.verdict) for op in operations), with_expiry=True),
    )
    for op in operations:
        approval_request_for_operation(op, parent=parent, requested_by_id=requested_by_id)
    notifications_add(parent, kind="new")
    _emit(parent, "approval.requested")
    return parent


def approvals_withdraw(*, run: Run, reason: str) -> int:
    """The run moved on (cancelled, compensated): nobody needs to decide any more, and nothing it still
    meant to do will be done. Run locked."""
    bus.run_changed(run.id)
    now = timezone.now()
    pending = ApprovalRequest.objects.filter(run=run, status=ApprovalRequest.Status.PENDING)
    ids = list(pending.values_list("id", flat=True))
    APPROVAL_REQUEST.move_where(pending, ApprovalRequest.Status.WITHDRAWN, decided_at=now, note=reason[:1000])
    questions_withdraw(run=run, reason=reason, now=now)
    OS = ToolOperation.Status
    why = f"not done: {reason}"[:1000]
    operations_decided(approval_ids=ids, approved=False, reason=why, now=now)
    # Proposals not bundled yet, and approved agent calls nobody has started: they will not be done either.
    OPERATION.move_where(
        ToolOperation.objects.filter(run=run, kind="action"),
        OS.REJECTED,
        sources=[OS.PROPOSED, OS.APPROVED],
        status_reason=why,
        ended_at=now,
    )
    return len(ids)


def approvals_withdraw_ids(*, ids: list[int], reason: str, now) -> int:
    """Withdraw these pending requests: the calls they were about will not be made (a retry from an
    earlier step superseded them). The caller holds the run's lock."""
    pending = ApprovalRequest.objects.filter(id__in=ids)
    return APPROVAL_REQUEST.move_where(pending, ApprovalRequest.Status.WITHDRAWN, decided_at=now, note=reason[:1000])


def approval_decide(
    *,
    request_id: int,
    user,
    approve: bool,
    note: str = "",
    seen_hash: str,
    edited_arguments: dict | None = None,
    request=None,
) -> ApprovalRequest:
    """One reviewer's decision, bound to the arguments hash they saw (``seen_hash``, in the admin too).
    Rejections need a comment; so do edited arguments, which are validated against the tool's schema
    and judged by the gate again. A request is approved once ``quorum`` distinct reviewers
    approved it, rejected at the first rejection. Deciding a parent decides each of its pending items.
    Exactly one outcome however many reviewers click at once: the request row is locked."""

    now = timezone.now()
    run_id = ApprovalRequest.objects.filter(id=request_id).values_list("run_id", flat=True).first()
    if run_id is None:
        raise NotFound(f"approval request {request_id} does not exist")
    target = f"approval request {request_id}"
    try:
        with transaction.atomic():
            run = Run.objects.select_for_update().get(id=run_id)
            approval = ApprovalRequest.objects.select_for_update().get(id=request_id)
            _check(approval, run, user, approve, note, seen_hash, edited_arguments)
            decided = _decide(approval, run, user, approve, note, edited_arguments, now)
            audit(
                actor=user,
                action=f"decide:{'approve' if approve else 'reject'}",
                run=run,
                target=target,
                request=request,
                detail={
                    "kind": approval.kind,
                    "note": note[:1000],
                    "arguments_hash": approval.arguments_hash,
                    "edited": edited_arguments is not None,
                    "outcome": decided,
                },
            )
    except (Conflict, Forbidden, InvalidInput) as refusal:  # recorded outside the rolled-back transaction
        audit_denied(actor=user, action="decide", run=Run.objects.get(id=run_id), target=target, request=request,
                     refusal=refusal)  # fmt: skip
        raise
    approval.refresh_from_db()
    return approval


def _check(approval, run, user, approve, note, seen_hash, edited) -> None:
    if user is None:
        raise Forbidden("a decision needs a reviewer")
    if approval.status != ApprovalRequest.Status.PENDING:
        raise Conflict(f"approval request {approval.id} is {approval.status}; it cannot be decided again")
    if approval.expires_at and approval.expires_at <= timezone.now():
        raise Conflict(f"approval request {approval.id} has expired; it cannot be decided")
    refusal = decider_refusal(approval, run=run, user=user)
    if refusal:
        raise Forbidden(refusal)
    if not seen_hash or seen_hash != approval.arguments_hash:
        raise Conflict("the arguments changed since you saw them: look again before deciding")
    if not approve and not note.strip():
        raise InvalidInput("a rejection needs a comment", [{"field": "note", "message": "required to reject"}])
    if approval.decisions.filter(reviewer=user).exists():
        raise Conflict(f"you have already decided approval request {approval.id}")
    if edited is not None:
        if not approve:
            raise InvalidInput("only an approval can carry edited arguments")
        if approval.decisions.filter(verdict="approve").exists():
            # Those reviewers approved other arguments: an edit now would count them for what they never saw.
            raise Conflict(
                f"approval request {approval.id} already has approvals of its current arguments; approve as "
                "they are, or reject with a comment and let the agent ask again"
            )
        if not note.strip():
            raise InvalidInput("edited arguments need a comment", [{"field": "note", "message": "required"}])
        if approval.kind == ApprovalRequest.Kind.PLAN:
            from .plans import plan_edit_check

            plan_edit_check(approval, run, edited)
        elif approval.kind != ApprovalRequest.Kind.OPERATION:
            raise InvalidInput("arguments can be edited on one operation at a time, not on a bundle")


def decider_refusal(approval: ApprovalRequest, *, run: Run, user) -> str:
    """Why ``user`` may not decide this request ('' when they may): separation of duties (whoever started
    the run, or asked for this work, cannot), and a verdict that reserves the decision for project
    admins. The role to decide at all is checked by ``authorize`` before this."""
    if run.started_by_id is not None and run.started_by_id == user.pk:
        return "separation of duties: whoever started a run cannot approve or reject its actions"
    if approval.requested_by_id is not None and approval.requested_by_id == user.pk:
        return "separation of duties: whoever asked for this work cannot approve or reject it"
    if approval.admins_only or (approval.policy_id is not None and approval.policy.decided_by_role == "admin"):
        if role_of(user, run.project_id) != "admin":
            return "a matching approval policy says only a project admin may decide this"
    return ""


def _decide(approval, run, user, approve, note, edited, now) -> str:
    """Record the decision on this request (and on each pending item of a parent); returns its outcome."""
    bus.run_changed(run.id)
    from .models import Decision

    verdict = Decision.Verdict.APPROVE if approve else Decision.Verdict.REJECT
    if approval.kind == ApprovalRequest.Kind.PLAN:
        from .plans import plan_decide

        Decision.objects.create(request=approval, reviewer=user, verdict=verdict, comment=note[:4000],
                                arguments_hash=approval.arguments_hash, edited_arguments=edited)  # fmt: skip
        plan_decide(approval, run, user, approve=approve, note=note, edited=edited, now=now)
        approval.refresh_from_db()
        return approval.status
    items = (
        [approval]
        if approval.kind == ApprovalRequest.Kind.OPERATION
        else list(approval.items.select_for_update().filter(status=ApprovalRequest.Status.PENDING))
    )
    for item in items:
        if item.decisions.filter(reviewer=user).exists():
            continue  # this reviewer decided that item alone already
        refusal = decider_refusal(item, run=run, user=user)
        if refusal:  # an item stricter than its parent (an edit raised it): refused whole, nothing recorded
            raise Forbidden(f"item {item.id}: {refusal}")
        if edited is not None:
            _apply_edit(item, edited, run=run, user=user)
        Decision.objects.create(
            request=item,
            reviewer=user,
            verdict=verdict,
            comment=note[:4000],
            arguments_hash=item.arguments_hash,
            edited_arguments=edited,
        )
        _settle_item(item, run, user, approve, note, now)
    if approval.kind != ApprovalRequest.Kind.OPERATION:
        _settle_parent(approval, run, user, note, now)
    elif approval.parent_id:
        _settle_parent(ApprovalRequest.objects.select_for_update().get(id=approval.parent_id), run, user, note, now)
    approval.refresh_from_db()
    return approval.status


def _settle_item(item, run, user, approve, note, now) -> None:
    # Only approvals of the arguments as they now are count (what the gate checks again before the call).
    approvals = item.decisions.filter(verdict="approve", arguments_hash=item.arguments_hash).count()
    if approve and approvals < item.quorum:
        return  # waits for more reviewers
    verdict = "approved" if approve else "rejected"
    reason = f"rejected by reviewer: {note}" if not approve else f"approved by {user}" + (f": {note}" if note else "")
    decided = ApprovalRequest.Status.APPROVED if approve else ApprovalRequest.Status.REJECTED
    APPROVAL_REQUEST.move(item, decided, decided_at=now, decided_by=user, note=note[:4000])
    operations_decided(approval_ids=[item.id], approved=approve, reason=reason, now=now)
    log.info("approval %s (%s) of run %s %s", item.id, item.kind, run.id, verdict)
    if item.parent_id is None:
        _emit(item, "approval.decided")
    if item.parent_id is None and item.task_id:
        _wake_parked_task(run, item, reason, now)
    elif item.parent_id is None and approve:
        run_operations_send(run)  # a supervised call asked again on its own (its declaration changed)


def _settle_parent(parent, run, user, note, now) -> None:
    """When every item of a bundle (or of a compensation's corrections) is decided, the executor goes on."""
    if parent.status != ApprovalRequest.Status.PENDING or parent.items.filter(status="pending").exists():
        return
    approved = parent.items.filter(status="approved").exists()
    decided = ApprovalRequest.Status.APPROVED if approved else ApprovalRequest.Status.REJECTED
    APPROVAL_REQUEST.move(parent, decided, decided_at=now, decided_by=user, note=note[:4000])
    _emit(parent, "approval.decided")
    if parent.kind == ApprovalRequest.Kind.BUNDLE and run.status == Run.Status.WAITING_FOR_APPROVAL:
        run_transition(run=run, to=Run.Status.RUNNING, reason=f"proposals decided by {user}", now=now)
    run_operations_send(run)


def _apply_edit(item, edited: dict, *, run: Run, user) -> None:
    """Approve-with-edits: validated against the tool's schema; both versions are kept on the ledger row.
    The gate judges the edited call again: its verdict becomes the stricter of the two, and a reviewer
    who may not decide the stricter one cannot make the edit."""
    op = ToolOperation.objects.select_for_update().get(approval=item)
    spec = tool_spec(op.tool, run.project_id)
    if spec is None:
        gone = [{"field": "arguments", "message": "no such tool"}]
        raise InvalidInput(f"{op.tool} is no longer a tool of this project", gone)
    if set(edited) & spec.secret_fields:
        raise InvalidInput("secret arguments cannot be edited", [{"field": "arguments", "message": "secret field"}])
    try:
        args = spec.arguments_validated({**op.arguments, **edited})
    except ArgumentsInvalid as exc:
        fields = [{**f, "field": f"arguments.{f['field']}"} for f in exc.fields]
        raise InvalidInput(f"the edited arguments are invalid for {op.tool}", fields) from exc
    origin = Origin.PROPOSAL if op.proposed else Origin.AGENT
    fresh = gate(run_id=op.run_id, tool=op.tool, arguments=args, origin=origin, agent_id=None)
    verdict = strictest([Verdict.from_json(op.verdict), fresh])
    new_hash = arguments_hash(op.tool, args)
    ToolOperation.objects.filter(id=op.id).update(
        original_arguments=op.arguments,
        original_hash=op.arguments_hash,
        arguments=redact(spec, args),
        arguments_hash=new_hash,
        gate=verdict.decision,
        verdict=verdict.to_json(),
    )
    item.arguments_hash = new_hash
    for name, value in _terms(verdict, with_expiry=False).items():
        setattr(item, name, value)
    item.save(update_fields=["arguments_hash", "quorum", "admins_only", "fail_on_reject"])
    refusal = decider_refusal(item, run=run, user=user)
    if refusal:
        raise Forbidden(f"with these arguments {refusal[0].lower()}{refusal[1:]}")
    if item.parent_id:  # the parent asks for the strictest of its items again
        parent = ApprovalRequest.objects.select_for_update().get(id=item.parent_id)
        verdicts = [
            Verdict.from_json(v)
            for v in ToolOperation.objects.filter(approval__parent=parent).values_list("verdict", flat=True)
        ]
        for name, value in _terms(strictest(verdicts), with_expiry=False).items():
            setattr(parent, name, value)
        parent.save(update_fields=["quorum", "admins_only", "fail_on_reject"])


def _wake_parked_task(run: Run, request: ApprovalRequest, reason: str, now) -> None:
    parked_task_wake(run, request.task_id, reason, now)


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
