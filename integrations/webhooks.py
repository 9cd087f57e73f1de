"""Outbound webhooks: ``run.finished``, ``run.needs_attention``, ``approval.requested``,
``approval.decided``, ``operation.ambiguous``.

A delivery row is written in the transaction that decided the event (so nothing is lost to a crash or
a restart), a message leaves through the outbox after commit, and the sender claims the row before it
posts (so of a duplicate message, or a sweeper racing it, only one sends). A failed post is retried
with exponential backoff, up to ``WEBHOOK_MAX_ATTEMPTS``; the admin lists every delivery and can
send one again. Delivery is at least once: receivers dedupe on ``Warden-Delivery``.

Each request is signed by the Standard Webhooks spec (``webhook-id``, ``webhook-timestamp``,
``webhook-signature``; core.outbound.standard_webhook_headers), the same scheme as the reviewers'
notifications. ``Warden-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of "<t>." + body>`` is still sent
for receivers written against it (deprecated: see the README).
"""

import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from core import bus, links, metrics, outbound
from core.errors import InvalidInput
from runs.models import Run
from runs.services import sql
from runs.services.outbox import outbox_add
from tenancy.audit import audit

from .models import WebhookDelivery, WebhookEndpoint

log = logging.getLogger("warden.webhooks")
DELIVER = "deliver_webhook"


def webhook_emit(
    *, event: str, project_id: int | None, data: dict | Callable[[], dict], run_id: int | None = None
) -> int:
    """Call inside the transaction that decided the event. Returns the deliveries written. Without a
    ``project_id``, the run's (``run_id``) is looked up, only when some endpoint could receive it.
    ``data``: the payload's data, or what makes it, called only when some endpoint could receive it."""
    assert event in WebhookEndpoint.EVENTS, event
    if not sql.fetchone("SELECT EXISTS (SELECT 1 FROM runs_webhookendpoint WHERE active)", [])[0]:
        return 0  # the common case, at the end of every run: one cheap statement
    if callable(data):
        data = data()
    if project_id is None and run_id is not None:
        project_id = Run.objects.filter(id=run_id).values_list("project_id", flat=True).first()
    endpoints = WebhookEndpoint.objects.filter(active=True).filter(Q(project__isnull=True) | Q(project_id=project_id))
    now = timezone.now()
    written = 0
    for endpoint in endpoints:
        if endpoint.events and event not in endpoint.events:
            continue
        delivery = WebhookDelivery.objects.create(
            endpoint=endpoint,
            event=event,
            payload={"event": event, "created_at": now.isoformat(), "data": data},
            next_attempt_at=now,
        )
        outbox_add(actor=DELIVER, kwargs={"delivery_id": delivery.id})
        written += 1
    return written


def run_settled_heard(event: bus.RunSettled) -> None:
    """The engine announced a run's end, or that it needs a person: its webhook, in that transaction. A
    replay's end is nobody's business outside (it changed nothing there)."""
    if event.replay:
        return
    name = "run.needs_attention" if event.status == Run.Status.NEEDS_ATTENTION else "run.finished"

    def data() -> dict:
        # Only when an endpoint is active: the URL is reversed through the URLconf, whose first load
        # costs a worker process about 0.2 s of CPU (bench/engine.py's CPU per step showed it).
        return {"run": event.run_id, "status": event.status, "reason": event.reason, "url": links.run_url(event.run_id)}

    # A worker's run object is built from the columns it needs and may not carry its project.
    webhook_emit(event=name, project_id=event.project_id, run_id=event.run_id, data=data)


def operation_ambiguous_heard(event: bus.OperationAmbiguous) -> None:
    """The broker announced a call whose outcome is unknown: its webhook, in that transaction."""
    webhook_emit(event="operation.ambiguous", project_id=event.project_id, data=event.data)


def signature(secret: str, timestamp: str, body: bytes) -> str:
    return hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def signature_valid(secret: str, header: str, body: bytes, *, tolerance: float = 300, now: float | None = None) -> bool:
    """What a receiver checks (also used by the tests and the example client)."""
    parts = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    timestamp, given = parts.get("t", ""), parts.get("v1", "")
    if not timestamp.isdigit() or abs((now or time.time()) - int(timestamp)) > tolerance:
        return False
    return hmac.compare_digest(signature(secret, timestamp, body), given)


def _claim_stale_after() -> timezone.timedelta:
    """A sender that died mid-post leaves its claim: the row is due again once no live post can still be
    running (twice the post's timeout, and a margin for the bookkeeping around it)."""
    return timezone.timedelta(seconds=2 * settings.WARDEN["WEBHOOK_TIMEOUT_SECONDS"] + 2)


def _backoff(attempts: int) -> float:
    base, cap = settings.WARDEN["WEBHOOK_RETRY_BASE_SECONDS"], settings.WARDEN["WEBHOOK_RETRY_CAP_SECONDS"]
    return min(cap, base * 2 ** max(0, attempts - 1))


def _signed_headers(delivery: WebhookDelivery, body: bytes) -> dict:
    timestamp = str(int(time.time()))
    return {
        "Content-Type": "application/json",
        "User-Agent": "Warden-Webhooks/1",
        "Warden-Event": delivery.event,
        "Warden-Delivery": str(delivery.id),
        "Warden-Signature": f"t={timestamp},v1={signature(delivery.endpoint.secret, timestamp, body)}",
        **outbound.standard_webhook_headers(delivery.endpoint.secret, f"msg_delivery_{delivery.id}", body),
    }


def webhook_deliver(*, delivery_id: int) -> bool:
    """Post one delivery if it is due and nobody else is posting it. True when it was delivered now."""
    now = timezone.now()
    stale = now - _claim_stale_after()
    due = Q(status=WebhookDelivery.Status.PENDING, next_attempt_at__lte=now) | Q(
        status=WebhookDelivery.Status.SENDING, claimed_at__lt=stale
    )
    delivery = WebhookDelivery.objects.filter(due, id=delivery_id).select_related("endpoint").first()
    if delivery is None:
        return False
    claimed = WebhookDelivery.objects.filter(id=delivery.id, status=delivery.status, attempts=delivery.attempts).update(
        status=WebhookDelivery.Status.SENDING, claimed_at=now, attempts=delivery.attempts + 1
    )
    if not claimed:
        return False
    attempts = delivery.attempts + 1
    body = json.dumps({"id": delivery.id, **delivery.payload}).encode()
    headers = _signed_headers(delivery, body)
    code, error = None, ""
    try:
        code = outbound.post(delivery.endpoint.url, body, headers, timeout=settings.WARDEN["WEBHOOK_TIMEOUT_SECONDS"])
        error = "" if 200 <= code < 300 else f"answered {code}"
    except outbound.OutboundRefused as exc:  # no retry can change where it leads
        log.warning("webhook %s refused: %s", delivery.id, exc)
        metrics.WEBHOOKS.labels("refused").inc()
        WebhookDelivery.objects.filter(id=delivery.id).update(
            status=WebhookDelivery.Status.FAILED, last_error=f"refused: {exc}"[:2000]
        )
        return False
    except OSError as exc:
        error = repr(exc)[:2000]
    delivered = code is not None and 200 <= code < 300
    metrics.WEBHOOKS.labels(
        "delivered" if delivered else ("failed" if attempts >= settings.WARDEN["WEBHOOK_MAX_ATTEMPTS"] else "retry")
    ).inc()
    if delivered:
        WebhookDelivery.objects.filter(id=delivery.id).update(
            status=WebhookDelivery.Status.DELIVERED, delivered_at=timezone.now(), last_status_code=code, last_error=""
        )
        return True
    if attempts >= settings.WARDEN["WEBHOOK_MAX_ATTEMPTS"]:
        log.warning("webhook %s gave up after %s attempts: %s", delivery.id, attempts, error)
        WebhookDelivery.objects.filter(id=delivery.id).update(
            status=WebhookDelivery.Status.FAILED, last_status_code=code, last_error=error
        )
        return False
    delay = _backoff(attempts)
    WebhookDelivery.objects.filter(id=delivery.id).update(
        status=WebhookDelivery.Status.PENDING,
        next_attempt_at=timezone.now() + timezone.timedelta(seconds=delay),
        last_status_code=code,
        last_error=error,
    )
    outbox_add(actor=DELIVER, kwargs={"delivery_id": delivery.id}, delay_ms=int(delay * 1000))
    return False


def webhooks_redrive(now) -> int:
    """The sweeper's part: deliveries overdue, whose message was lost (a restart, a broker outage), are
    sent to a worker again; the sender's claim keeps a message that was only late from posting twice."""
    stale = now - _claim_stale_after()
    lag = now - timezone.timedelta(seconds=settings.WARDEN["OUTBOX_RESEND_AFTER_SECONDS"])
    due = WebhookDelivery.objects.filter(
        Q(status=WebhookDelivery.Status.PENDING, next_attempt_at__lte=lag)
        | Q(status=WebhookDelivery.Status.SENDING, claimed_at__lt=stale)
    ).values_list("id", flat=True)[:200]
    ids = list(due)
    for delivery_id in ids:
        outbox_add(actor=DELIVER, kwargs={"delivery_id": delivery_id})
    return len(ids)


def webhook_redeliver(*, delivery_id: int) -> None:
    """An operator's "send again" (the admin): due now, with a fresh count of attempts."""
    WebhookDelivery.objects.filter(id=delivery_id).update(
        status=WebhookDelivery.Status.PENDING, next_attempt_at=timezone.now(), attempts=0
    )
    outbox_add(actor=DELIVER, kwargs={"delivery_id": delivery_id})


def webhooks_sweep(now) -> dict:
    """The recovery sweeper's pass (registered in integrations/apps.py)."""
    return {"webhooks_redriven": webhooks_redrive(now)}


def webhook_endpoint_save(*, endpoint: WebhookEndpoint, actor, created: bool, request=None) -> WebhookEndpoint:
    """Register (or change) an endpoint: its URL may not lead to this machine, a private network or a
    metadata service (core/outbound.py); the change is audited, the secret never."""
    why = outbound.url_refusal(endpoint.url)
    if why:
        raise InvalidInput(f"this webhook URL is refused: {why}", [{"field": "url", "message": why}])
    endpoint.save()
    audit(
        actor=actor,
        action="webhook_endpoint_add" if created else "webhook_endpoint_change",
        project_id=endpoint.project_id,
        target=endpoint.url[:200],
        request=request,
        detail={"events": endpoint.events, "active": endpoint.active},
    )
    return endpoint
