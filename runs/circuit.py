"""A circuit breaker kept in the shared cache (Redis in scaled mode), so every worker sees it: enough
failures in a row open it for a while; one success closes it. Tools (tools/broker.py) and model
providers (agents/gateway.py) each keep one per name."""

import logging
import time

from django.conf import settings
from django.core.cache import cache

log = logging.getLogger("warden.circuit")


class Breaker:
    def __init__(self, *, prefix: str, failures_setting: str, open_setting: str):
        self.prefix, self.failures_setting, self.open_setting = prefix, failures_setting, open_setting

    def _key(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    def reset(self, names) -> None:
        cache.delete_many([self._key(name) for name in names])

    def open_for(self, name: str) -> float:
        """Seconds the breaker stays open, or 0."""
        state = cache.get(self._key(name)) or {}
        return max(0.0, state.get("open_until", 0) - time.time())

    def record(self, name: str, ok: bool) -> None:
        key = self._key(name)
        if ok:
            if cache.get(key):
                cache.delete(key)
            return
        limit, seconds = settings.WARDEN[self.failures_setting], settings.WARDEN[self.open_setting]
        state = cache.get(key) or {"failures": 0, "open_until": 0}
        state["failures"] += 1
        if state["failures"] >= limit:
            state = {"failures": 0, "open_until": time.time() + seconds}
            log.warning("%s: breaker open for %ss", self._key(name), seconds)
        cache.set(key, state, timeout=max(60, int(seconds) + 1))
