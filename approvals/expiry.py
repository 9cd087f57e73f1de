"""Sweeper steps for approval requests: a reminder once before expiry, and at expiry what the policy
says — reject (the request is expired and its operations are not done) or escalate once to the
project's admins, with as long again to decide."""

import logging

from django.db import transaction
from django.utils import timezone

from policy.models import ApprovalPolicy, ApprovalRequest
from runs.models import Run
from saga.compensation import run_operations_send
from tools.broker import operations_decided

from .models import Notification
from .notify import notifications_add, notifications_due
from .services import _wake_parked_task
from .transitions import APPROVAL_REQUEST

log = logging.getLogger("warden.approvals")
PENDING = ApprovalRequest.Status.PENDING


def approvals_remind(now) -> int:
    reminded = 0
    due = ApprovalRequest.objects.filter(
        status=PENDING, parent=None, reminded_at__isnull=True, expires_at__isnull=False, policy__isnull=False
    ).exclude(policy__remind_before_seconds__isnull=True)
    for request in due.select_related("policy"):
        if request.expires_at - timezone.timedelta(seconds=request.policy.remind_before_seconds) > now:
            continue
        with transaction.atomic():
            if ApprovalRequest.objects.filter(id=request.id, reminded_at__isnull=True).update(reminded_at=now):
                notifications_add(request, kind=Notification.Kind.REMINDER)
                reminded += 1
    return reminded


def approvals_expire(now) -> int:
    expired = 0
    for request_id in ApprovalRequest.objects.filter(status=PENDING, expires_at__lte=now).values_list("id", flat=True):
        expired += _expire(request_id, now)
    return expired


def _expire(request_id: int, now) -> int:
    run_id = ApprovalRequest.objects.values_list("run_id", flat=True).get(id=request_id)
    with transaction.atomic():
        run = Run.objects.select_for_update().get(id=run_id)
        request = ApprovalRequest.objects.select_for_update().get(id=request_id)
        if request.status != PENDING or not request.expires_at or request.expires_at > now:
            return 0
        policy = request.policy
        if policy and policy.on_expiry == ApprovalPolicy.OnExpiry.ESCALATE and request.escalated_at is None:
            lasted = request.expires_at - request.requested_at
            request.escalated_at, request.expires_at = now, now + lasted
            request.save(update_fields=["escalated_at", "expires_at"])
            notifications_add(request, kind=Notification.Kind.ESCALATION)
            log.info("approval %s escalated to the project's admins", request.id)
            return 1
        requests = [request, *request.items.select_for_update().filter(status=PENDING)]
        reason = "not done: nobody decided before the request expired"
        for item in requests:
            APPROVAL_REQUEST.move(item, ApprovalRequest.Status.EXPIRED, decided_at=now, note="expired")
            operations_decided(approval_ids=[item.id], approved=False, reason=reason, now=now)
        log.info("approval %s expired", request.id)
        if request.task_id:
            _wake_parked_task(run, request, reason, now)
        elif request.kind != ApprovalRequest.Kind.OPERATION or request.parent_id:
            run_operations_send(run)
        return 1


def approvals_sweep(now) -> dict:
    return {"approvals_reminded": approvals_remind(now), "approvals_expired": approvals_expire(now)}


def approvals_and_notifications_sweep(now) -> dict:
    """The approvals' pass of the recovery sweeper (registered in approvals/apps.py)."""
    return {**approvals_sweep(now), "notifications_due": notifications_due(now)}
