"""Paging about circuit breakers: when one opens (closed → open: once per opening, not again when a
failed probe opens it anew), the people who own what it stops are told. A project's own tool's breaker
(an HTTP or MCP tool it declared) pages the admins of that project, by e-mail; the deployment's (a
registry tool's, a model provider's) pages the superusers by e-mail and the approval webhook
(Slack-compatible, approvals/notify.py).

The opening is announced on core.bus by the breaker; the rows and the outbox message that sends them are
written in one transaction after it, and a worker sends them (approvals/actors.py), claimed first so each
goes out once. Nothing is sent from the tool call's path. The sweeper writes the rows of an opening whose
announcement was lost (a crash) and asks a worker to send what still waits.
"""

import json
import logging
import time
from datetime import UTC, datetime

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from core import links, outbound
from core.circuit import BreakerRef
from runs.services.breakers import BREAKERS
from runs.services.outbox import outbox_add
from tenancy.models import Membership

from .models import BreakerNotification
from .notify import RESEND_AFTER_SECONDS, claimed_send, signature

log = logging.getLogger("warden.notify")
BREAKER_NOTIFY = "send_breaker_notifications"  # the actor (approvals/actors.py)


def _key(breaker: BreakerRef) -> str:
    return f"{breaker.what}:{breaker.key}"


def breaker_opened_heard(breaker: BreakerRef, opened_at: float) -> None:
    """core.bus: a breaker opened."""
    breaker_notifications_add(breaker, opened_at=opened_at)


def breaker_notifications_add(breaker: BreakerRef, *, opened_at: float) -> int:
    """The pages of one opening, and the message that has a worker send them. Returns how many wait."""
    when = datetime.fromtimestamp(opened_at, tz=UTC)
    webhook = breaker.project_id is None and settings.WARDEN["APPROVAL_WEBHOOK_URL"]
    page = {"breaker": _key(breaker), "kind": breaker.what, "name": breaker.name, "opened_at": when}
    channels = ["email"] + (["webhook"] if webhook else [])
    rows = [BreakerNotification(**page, project_id=breaker.project_id, channel=channel) for channel in channels]
    with transaction.atomic():
        BreakerNotification.objects.bulk_create(rows, ignore_conflicts=True)  # once per opening and channel
        ids = list(_due(timezone.now()).filter(breaker=_key(breaker), opened_at=when).values_list("id", flat=True))
        if ids:
            outbox_add(actor=BREAKER_NOTIFY, kwargs={"ids": ids})
    return len(ids)


def breaker_pages_sweep(now) -> dict:
    """The sweeper's pass: the pages of an open breaker whose opening nobody wrote (its announcement was
    lost), then a worker asked to send whatever waits (never sent, or its sender died)."""
    opened = [s for breaker in BREAKERS.values() for s in breaker.open_now() if s.opened_at]
    written = 0
    if opened:
        known = set(
            BreakerNotification.objects.filter(breaker__in={_key(s.ref) for s in opened}).values_list(
                "breaker", "opened_at"
            )
        )
        for s in opened:
            if (_key(s.ref), datetime.fromtimestamp(s.opened_at, tz=UTC)) not in known:
                written += breaker_notifications_add(s.ref, opened_at=s.opened_at)
    due = _due(now).count()
    if due and not written:
        with transaction.atomic():
            outbox_add(actor=BREAKER_NOTIFY, kwargs={"ids": None})
    return {"breaker_pages_written": written, "breaker_pages_due": due}


def _due(now):
    stale = now - timezone.timedelta(seconds=RESEND_AFTER_SECONDS)
    return BreakerNotification.objects.filter(sent_at__isnull=True).filter(
        Q(claimed_at__isnull=True) | Q(claimed_at__lt=stale)
    )


def breaker_notifications_send(ids=None) -> int:
    """Send the given (or every due) page not sent yet. Returns how many went out."""
    now = timezone.now()
    due = _due(now) if ids is None else _due(now).filter(id__in=ids)
    rows = due.select_related("project")
    return claimed_send(rows, model=BreakerNotification, send=_deliver, now=now, what="breaker page")


def _deliver(note: BreakerNotification) -> None:
    (_email if note.channel == "email" else _webhook)(note)


def _recipients(note: BreakerNotification) -> list[str]:
    if note.project_id is not None:
        members = Membership.objects.filter(project_id=note.project_id, role="admin").select_related("user")
        users = [m.user for m in members]
    else:
        users = list(get_user_model().objects.filter(is_superuser=True))
    return sorted({u.email for u in users if u.email and u.is_active})


def _label(note: BreakerNotification) -> str:
    return f"the {note.kind} {note.name}" + (f" of project {note.project.slug}" if note.project_id else "")


def _link() -> str:
    return links.breakers_url()


def _text(note: BreakerNotification) -> str:
    breaker = BREAKERS[note.kind]
    failures, seconds = settings.WARDEN[breaker.failures_setting], settings.WARDEN[breaker.open_setting]
    return (
        f"{_label(note)[0].upper()}{_label(note)[1:]} failed {failures} times in a row: its breaker opened at "
        f"{note.opened_at:%Y-%m-%d %H:%M:%S} UTC. Calls to it are refused for {seconds:g}s; then one call probes "
        "it, and a success closes it and resumes the tasks it parked.\n"
        f"What it parked, and closing it by hand: {_link()}\n"
    )


def _email(note: BreakerNotification) -> None:
    recipients = _recipients(note)
    if recipients:
        subject = f"[Warden] Breaker open: {_label(note)}"
        send_mail(subject, _text(note), settings.DEFAULT_FROM_EMAIL, recipients, fail_silently=False)


def _webhook(note: BreakerNotification) -> None:
    payload = {
        "event": "breaker.opened",
        "breaker": {
            "kind": note.kind,
            "name": note.name,
            "project": note.project.slug if note.project_id else None,
            "opened_at": note.opened_at.isoformat(),
            "link": _link(),
        },
    }
    if settings.WARDEN["APPROVAL_WEBHOOK_SLACK"]:
        payload["text"] = _text(note)  # what Slack's incoming webhooks show
    body = json.dumps(payload).encode()
    timestamp = str(int(time.time()))
    secret = settings.WARDEN["APPROVAL_WEBHOOK_SECRET"]
    headers = {"Content-Type": "application/json", "X-Warden-Timestamp": timestamp}
    if secret:
        headers.update(outbound.standard_webhook_headers(secret, f"msg_breaker_{note.id}", body))
        headers["X-Warden-Signature"] = "sha256=" + signature(secret, timestamp, body)  # as approvals' pages
    status = outbound.post(settings.WARDEN["APPROVAL_WEBHOOK_URL"], body, headers, timeout=5)
    if status >= 300:
        raise RuntimeError(f"webhook answered {status}")
