"""The per-token request limit, shared by the API and the OTLP endpoint."""

import time

from django.conf import settings
from django.core.cache import cache


class RateLimited(Exception):
    def __init__(self, retry_after: int):
        self.retry_after = retry_after


def rate_check(token_key: str) -> None:
    """A fixed one-minute window per token in the shared cache (Redis in scaled mode): over the limit,
    429 with Retry-After until the window ends. A guard against runaway clients, not a security control."""
    limit = settings.WARDEN["API_RATE_PER_MINUTE"]
    now = time.time()
    window = int(now // 60)
    key = f"api-rate:{token_key}:{window}"
    if cache.add(key, 1, timeout=120):
        return
    try:
        count = cache.incr(key)
    except ValueError:  # expired between the two calls
        cache.add(key, 1, timeout=120)
        return
    if count > limit:
        raise RateLimited(retry_after=max(1, int((window + 1) * 60 - now) + 1))
