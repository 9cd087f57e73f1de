"""Approval requests decided by people (the queue, the admin, the API, a decision link); the policy app
creates them (policy/services.py) for the broker and the engine.

A decision is applied under the run's lock (lock order: run, then tasks and operations) so that it can
race neither the task that is about to park nor another reviewer.
"""

import logging

from django.db import transaction
from django.utils import timezone

from core import bus
from core.errors import Conflict, Forbidden, InvalidInput, NotFound
from policy.deciders import Refusal, request_admins_only
from policy.deciders import decider_refusal as rule_refusal
from policy.models import ApprovalRequest, Decision
from policy.services import request_terms
from runs.models import Run
from runs.selectors import run_gate_facts
from runs.services.runs import run_transition
from saga.compensation import run_operations_send
from tenancy.audit import audit, audit_denied
from tools.broker import arguments_hash, operations_decided
from tools.catalog import tool_spec
from tools.gate import Origin, Verdict, gate, strictest
from tools.kit import ArgumentsInvalid
from tools.models import ToolOperation
from tools.registry import redact

from .announce import request_announce
from .links import link_open
from .models import DecisionLink
from .plans import plan_decide, plan_edit_check
from .transitions import APPROVAL_REQUEST
from .wake import parked_task_wake

log = logging.getLogger("warden.approvals")


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
    if refusal is not None:
        raise refusal
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
            plan_edit_check(approval, run, edited)
        elif approval.kind != ApprovalRequest.Kind.OPERATION:
            raise InvalidInput("arguments can be edited on one operation at a time, not on a bundle")


def decider_refusal(approval: ApprovalRequest, *, run: Run, user) -> Forbidden | None:
    """Why ``user`` may not decide this request (None when they may), by the one decider rule
    (policy/deciders.py): separation of duties (whoever started the run, or asked for this work,
    cannot), and a verdict that reserves the decision for project admins. The role to decide at all is
    checked by ``authorize`` before this."""
    refusal = rule_refusal(
        user, project_id=run.project_id, started_by_id=run.started_by_id, requested_by_id=approval.requested_by_id,
        admins_only=request_admins_only(approval), role_known=True,
    )  # fmt: skip
    return Forbidden(REFUSALS[refusal]) if refusal else None


REFUSALS = {
    Refusal.STARTED_THE_RUN: "separation of duties: whoever started a run cannot approve or reject its actions",
    Refusal.ASKED_FOR_IT: "separation of duties: whoever asked for this work cannot approve or reject it",
    Refusal.ADMINS_ONLY: "a matching approval policy says only a project admin may decide this",
    Refusal.NOT_A_DECIDER: "you may not decide in this project",
}


def _decide(approval, run, user, approve, note, edited, now) -> str:
    """Record the decision on this request (and on each pending item of a parent); returns its outcome."""
    bus.run_changed(run.id)

    verdict = Decision.Verdict.APPROVE if approve else Decision.Verdict.REJECT
    if approval.kind == ApprovalRequest.Kind.PLAN:
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
        if refusal is not None:  # an item stricter than its parent (an edit raised it): refused whole, nothing recorded
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
        request_announce(item, "approval.decided")
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
    request_announce(parent, "approval.decided")
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
    facts = run_gate_facts(op.run_id, op.tool)
    fresh = gate(run_id=op.run_id, facts=facts, tool=op.tool, arguments=args, origin=origin, agent_id=None)
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
    for name, value in request_terms(verdict, with_expiry=False).items():
        setattr(item, name, value)
    item.save(update_fields=["arguments_hash", "quorum", "admins_only", "fail_on_reject"])
    refusal = decider_refusal(item, run=run, user=user)
    if refusal is not None:
        why = str(refusal)
        raise Forbidden(f"with these arguments {why[0].lower()}{why[1:]}")
    if item.parent_id:  # the parent asks for the strictest of its items again
        parent = ApprovalRequest.objects.select_for_update().get(id=item.parent_id)
        verdicts = [
            Verdict.from_json(v)
            for v in ToolOperation.objects.filter(approval__parent=parent).values_list("verdict", flat=True)
        ]
        for name, value in request_terms(strictest(verdicts), with_expiry=False).items():
            setattr(parent, name, value)
        parent.save(update_fields=["quorum", "admins_only", "fail_on_reject"])


def _wake_parked_task(run: Run, request: ApprovalRequest, reason: str, now) -> None:
    parked_task_wake(run, request.task_id, reason, now)


def link_decide(*, token: str, user, approve: bool, note: str = "", request=None) -> ApprovalRequest:
    """Decide through a decision link (approvals/links.py), once: the link row is locked and spent in the
    decision's transaction."""
    with transaction.atomic():
        link = link_open(token, user=user, request=request)
        spent = DecisionLink.objects.filter(id=link.id, used_at__isnull=True).update(
            used_at=timezone.now(), used_by=user
        )
        if not spent:
            raise Conflict("this link was used a moment ago: it decides once")
        return approval_decide(
            request_id=link.request_id,
            user=user,
            approve=approve,
            note=note,
            seen_hash=link.arguments_hash,
            request=request,
        )
