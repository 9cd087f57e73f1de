"""``Idempotency-Key`` for every write of the integration API, with Stripe's semantics.

The same key with the same request (method, path, body) returns the first response, marked
``Idempotent-Replayed: true``; with another request, 409; while the first is still being handled,
409 with ``Retry-After``. Keys belong to the caller (the hash of their credentials), are kept at least
72 hours (``WARDEN["IDEMPOTENCY_KEEP_HOURS"]``) and pruned by the recovery sweeper. A request that
failed before doing anything (401, 429, 5xx) releases its key, so a retry with it is handled afresh;
one whose handler died holding the key frees it after ``IDEMPOTENCY_IN_FLIGHT_SECONDS``.
"""

import hashlib

from django.conf import settings
from django.db import IntegrityError, transaction
from django.http import HttpResponse, JsonResponse
from django.utils import timezone

from tenancy.tokens import api_token_authenticate

from .models import IdempotencyKey

PREFIX = "/api/v1/"
HEADER = "HTTP_IDEMPOTENCY_KEY"
# Nothing was done (refused before the handler acted, or invalid input), so a retry with the key must be
# handled afresh, as Stripe does; every 5xx too.
RELEASE = {400, 401, 422, 429}


def _error(status: int, code: str, message: str, **headers) -> JsonResponse:
    response = JsonResponse({"code": code, "message": message, "errors": []}, status=status)
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def _digest(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


def _authenticates(credentials: str) -> bool:

    scheme, _, token = credentials.partition(" ")
    return scheme.lower() == "bearer" and bool(token) and api_token_authenticate(token) is not None


class IdempotencyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        key = request.META.get(HEADER)
        credentials = request.META.get("HTTP_AUTHORIZATION", "")
        if key is None or request.method != "POST" or not request.path.startswith(PREFIX) or not credentials:
            return self.get_response(request)  # without credentials the API answers 401 anyway
        if not _authenticates(credentials):
            return self.get_response(request)  # the API answers 401; nothing is kept for a stranger
        if not key or len(key) > 255 or not key.isascii() or not key.isprintable() or " " in key:
            return _error(400, "invalid_idempotency_key", "Idempotency-Key must be 1 to 255 visible ASCII characters")
        scope = _digest(credentials.encode())
        fingerprint = _digest(request.method.encode(), request.path.encode(), request.body)
        claimed, refusal = self._claim(scope, key, fingerprint)
        if refusal is not None:
            return refusal
        try:
            response = self.get_response(request)
        except Exception:
            IdempotencyKey.objects.filter(id=claimed.id).delete()
            raise
        if response.status_code in RELEASE or response.status_code >= 500 or response.streaming:
            IdempotencyKey.objects.filter(id=claimed.id).delete()
            return response
        IdempotencyKey.objects.filter(id=claimed.id).update(
            status=IdempotencyKey.Status.DONE,
            response_status=response.status_code,
            response_body=response.content.decode(),
            response_type=response.get("Content-Type", "application/json"),
        )
        return response

    def _claim(self, scope: str, key: str, fingerprint: str):
        """(the row this request now holds, None) or (None, the response to give instead)."""
        now = timezone.now()
        stale = now - timezone.timedelta(seconds=settings.WARDEN["IDEMPOTENCY_IN_FLIGHT_SECONDS"])
        try:
            with transaction.atomic():
                row = IdempotencyKey.objects.create(scope=scope, key=key, fingerprint=fingerprint, locked_at=now)
            return row, None
        except IntegrityError:
            pass
        row = IdempotencyKey.objects.filter(scope=scope, key=key).first()
        if row is None:  # pruned between the two statements: a fresh request
            return self._claim(scope, key, fingerprint)
        if row.fingerprint != fingerprint:
            return None, _error(
                409, "idempotency_key_reused", "this Idempotency-Key was used with another request; use a new key"
            )
        if row.status == IdempotencyKey.Status.DONE:
            replay = HttpResponse(row.response_body, status=row.response_status, content_type=row.response_type)
            replay["Idempotent-Replayed"] = "true"
            return None, replay
        # In flight: still being handled — unless its handler died long ago, then this request takes it over.
        taken = IdempotencyKey.objects.filter(id=row.id, status=row.status, locked_at__lt=stale).update(locked_at=now)
        if taken:
            row.locked_at = now
            return row, None
        return None, _error(
            409,
            "idempotency_key_in_flight",
            "a request with this Idempotency-Key is still being handled",
            Retry_After="1",
        )


def idempotency_keys_prune(now) -> int:
    keep = timezone.timedelta(hours=max(72, settings.WARDEN["IDEMPOTENCY_KEEP_HOURS"]))
    deleted, _ = IdempotencyKey.objects.filter(created_at__lt=now - keep).delete()
    return deleted


def idempotency_sweep(now) -> dict:
    """The recovery sweeper's pass (registered in integrations/apps.py)."""
    return {"idempotency_keys_pruned": idempotency_keys_prune(now)}
