"""API token issue and check. Only the SHA-256 of a token is stored."""

import hashlib
import secrets

from django.utils import timezone

from core.errors import Forbidden

from .audit import audit
from .models import ApiToken

TOKEN_PREFIX = "wdn_"


def _digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def api_token_create(
    *, user, name: str = "", expires_at=None, scopes=None, for_agent: bool = False, created_by=None, request=None
) -> tuple[ApiToken, str]:
    """Returns the row and the secret, which is never shown again. Without ``scopes``: read, run and
    operate — deciding approvals needs a token made for it (``approve``), configuring a project one made
    with ``admin``. ``created_by``: who asks, in the admin (the command is a trusted operator's): a token
    is made for oneself only, superusers excepted; it is audited."""
    scopes = sorted(set(ApiToken.DEFAULT_SCOPES if scopes is None else scopes))
    unknown = set(scopes) - set(ApiToken.Scope.values)
    if unknown:
        raise ValueError(f"unknown token scopes: {sorted(unknown)}")
    if for_agent and {ApiToken.Scope.APPROVE, ApiToken.Scope.ADMIN} & set(scopes):
        raise ValueError("a token used by an agent never has the approve or admin scope")
    if created_by is not None and not created_by.is_superuser and created_by.pk != user.pk:
        audit(actor=created_by, action="token_add", outcome="denied", target=str(user), request=request)
        raise Forbidden("an API token can be made only for yourself")
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user,
        name=name,
        prefix=raw[:10],
        token_hash=_digest(raw),
        expires_at=expires_at,
        scopes=scopes,
        for_agent=for_agent,
    )
    if created_by is not None:
        detail = {"token": token.prefix, "scopes": scopes, "for_agent": for_agent}
        audit(actor=created_by, action="token_add", target=str(user), request=request, detail=detail)
    return token, raw


def api_token_authenticate(raw: str) -> ApiToken | None:
    if not raw or not raw.startswith(TOKEN_PREFIX) or len(raw) > 200:
        return None
    now = timezone.now()
    token = ApiToken.objects.select_related("user").filter(token_hash=_digest(raw), revoked_at__isnull=True).first()
    if token is None or not token.user.is_active or (token.expires_at and token.expires_at <= now):
        return None
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(id=token.id).update(last_used_at=now)  # at most once a minute per token
    return token


def api_token_revoke(*, token: ApiToken) -> None:
    ApiToken.objects.filter(id=token.id, revoked_at__isnull=True).update(revoked_at=timezone.now())
