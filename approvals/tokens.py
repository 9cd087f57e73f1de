"""API token issue and check. Only the SHA-256 of a token is stored."""

import hashlib
import secrets

from django.utils import timezone

from .models import ApiToken

TOKEN_PREFIX = "wdn_"


def _digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def api_token_create(
    *, user, name: str = "", expires_at=None, scopes=None, for_agent: bool = False
) -> tuple[ApiToken, str]:
    """Returns the row and the secret, which is never shown again. Without ``scopes``: read, run and
    operate — deciding approvals needs a token made for it (``approve``)."""
    scopes = sorted(set(ApiToken.DEFAULT_SCOPES if scopes is None else scopes))
    unknown = set(scopes) - set(ApiToken.Scope.values)
    if unknown:
        raise ValueError(f"unknown token scopes: {sorted(unknown)}")
    if for_agent and ApiToken.Scope.APPROVE in scopes:
        raise ValueError("a token used by an agent never has the approve scope")
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
