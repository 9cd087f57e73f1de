"""Telling reviewers: e-mail through Django's backend and, where configured, an HMAC-signed webhook
(optionally Slack-compatible). A notification row and the outbox message that sends it are written in
the transaction that makes the request; a worker sends it (approvals/actors.py), claimed first so each
goes out once. The sweeper only asks a worker to send what a crash left behind: no network I/O happens
in a commit hook or in the sweeper's pass."""

import hashlib
import hmac
import json
import logging
import time

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from core import links, outbound
from policy.models import ApprovalRequest
from runs.services.outbox import outbox_add
from tenancy.models import Membership

from .links import decision_link
from .models import Notification

log = logging.getLogger("warden.notify")
RESEND_AFTER_SECONDS = 60
NOTIFY = "send_notifications"  # the actor (approvals/actors.py)


def _channels() -> list[str]:
    return ["email"] + (["webhook"] if settings.WARDEN["APPROVAL_WEBHOOK_URL"] else [])


def notifications_add(request: ApprovalRequest, *, kind: str) -> None:
    """Inside the transaction that creates (or reminds of, or escalates) the request."""
    rows = [Notification(request=request, channel=channel, kind=kind) for channel in _channels()]
    created = Notification.objects.bulk_create(rows, ignore_conflicts=True)
    ids = [n.id for n in created if n.id] or list(
        Notification.objects.filter(request=request, kind=kind, sent_at__isnull=True).values_list("id", flat=True)
    )
    outbox_add(actor=NOTIFY, kwargs={"ids": ids})


def notifications_due(now=None) -> int:
    """The sweeper's part: if notifications wait (never sent, or a sender died after claiming them), a
    worker is asked to send them. Returns how many wait."""
    now = now or timezone.now()
    due = _due(now).count()
    if due:
        with transaction.atomic():
            outbox_add(actor=NOTIFY, kwargs={"ids": None})
    return due


def _due(now):
    stale = now - timezone.timedelta(seconds=RESEND_AFTER_SECONDS)
    return Notification.objects.filter(sent_at__isnull=True).filter(
        Q(claimed_at__isnull=True) | Q(claimed_at__lt=stale)
    )


def link(request: ApprovalRequest) -> str:
    top = request.parent_id or request.id  # the queue shows a bundle as one card
    return links.approval_url(top)


def notifications_send(ids=None) -> int:
    """Send the given (or every due) notification not sent yet. Returns how many went out."""
    now = timezone.now()
    due = _due(now)
    if ids is not None:
        due = due.filter(id__in=ids)
    rows = due.select_related("request__run__project")
    return claimed_send(rows, model=Notification, send=_deliver, now=now, what="notification")


def _deliver(note: Notification) -> None:
    (_email if note.channel == "email" else _webhook)(note)


def claimed_send(rows, *, model, send, now, what: str) -> int:
    """Send each row (a notification, a breaker's page) not sent yet, each claimed first: of several
    senders (after commit, sweepers) only one sends it; a failure stays on the row for the next sweep.
    Returns how many went out."""
    sent = 0
    for note in rows:
        if not model.objects.filter(id=note.id, sent_at__isnull=True, claimed_at=note.claimed_at).update(
            claimed_at=now
        ):
            continue
        try:
            send(note)
        except Exception as exc:  # the next sweep tries again
            log.warning("%s %s (%s) failed: %r", what, note.id, note.channel, exc)
            model.objects.filter(id=note.id).update(error=repr(exc)[:2000])
            continue
        model.objects.filter(id=note.id).update(sent_at=timezone.now(), error="")
        sent += 1
    return sent


def _recipients(request: ApprovalRequest, kind: str) -> list[str]:
    roles = ["admin"] if kind == Notification.Kind.ESCALATION else ["reviewer", "admin"]
    members = Membership.objects.filter(project_id=request.run.project_id, role__in=roles).select_related("user")
    return sorted({m.user.email for m in members if m.user.email and m.user.is_active})


def _subject(note: Notification) -> str:
    request = note.request
    what = {"new": "Approval needed", "reminder": "Reminder: approval needed", "escalation": "Escalated"}[note.kind]
    return f"[Warden] {what}: run {request.run_id} ({request.get_kind_display()})"


def _text(note: Notification, decide: str) -> str:
    request = note.request
    expiry = f"\nExpires at {request.expires_at:%Y-%m-%d %H:%M} UTC." if request.expires_at else ""
    return (
        f"{request.summary}\n\nDecide (after you log in; this link decides once): {decide}\n"
        f"Or from the reviewer queue: {link(request)}{expiry}\n"
    )


def _email(note: Notification) -> None:
    recipients = _recipients(note.request, note.kind)
    if recipients:
        text = _text(note, decision_link(note.request))
        send_mail(_subject(note), text, settings.DEFAULT_FROM_EMAIL, recipients, fail_silently=False)


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """Receivers check: hex HMAC-SHA256 of "<timestamp>." + body, with the shared secret."""
    return hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def _webhook(note: Notification) -> None:
    request = note.request
    decide = decision_link(request)
    payload = {
        "event": f"approval.{note.kind}",
        "request": {
            "id": request.id,
            "run": request.run_id,
            "project": request.run.project.slug,
            "kind": request.kind,
            "summary": request.summary,
            "link": link(request),
            "decide": decide,
            "expires_at": request.expires_at.isoformat() if request.expires_at else None,
        },
    }
    if settings.WARDEN["APPROVAL_WEBHOOK_SLACK"]:
        payload["text"] = f"{_subject(note)}\nDecide: {decide}"  # what Slack's incoming webhooks show
    body = json.dumps(payload).encode()
    timestamp = str(int(time.time()))
    secret = settings.WARDEN["APPROVAL_WEBHOOK_SECRET"]
    headers = {"Content-Type": "application/json", "X-Warden-Timestamp": timestamp}
    if secret:
        headers.update(outbound.standard_webhook_headers(secret, f"msg_notification_{note.id}", body))
        headers["X-Warden-Signature"] = "sha256=" + signature(secret, timestamp, body)  # deprecated (README)
    status = outbound.post(settings.WARDEN["APPROVAL_WEBHOOK_URL"], body, headers, timeout=5)
    if status >= 300:
        raise RuntimeError(f"webhook answered {status}")
