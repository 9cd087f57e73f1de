"""Limits kept in the shared cache (Redis in scaled mode), so every worker sees them, for tools
(tools/broker.py) and model providers (agents/gateway.py) alike: a circuit breaker (enough failures in
a row open it for a while; one success closes it) and a rate limit (a fixed one-minute window)."""

import logging
import time

from django.conf import settings
from django.core.cache import cache

from core.cache import tolerant

log = logging.getLogger("warden.circuit")


class Breaker:
    def __init__(self, *, prefix: str, failures_setting: str, open_setting: str):
        self.prefix, self.failures_setting, self.open_setting = prefix, failures_setting, open_setting

    def _key(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    def reset(self, names) -> None:
        names = list(names)
        cache.delete_many([self._key(name) for name in names])
        tolerant(lambda: self._forget(names), None)

    def open_now(self) -> list[tuple[str, float]]:
        """(name, seconds left) of each breaker open now: what the inbox lists for a person to look at."""
        known = tolerant(lambda: cache.get(self._registry()), None) or {}
        return sorted((name, left) for name in known if (left := self.open_for(name)) > 0)

    def _registry(self) -> str:
        return f"{self.prefix}:opened"

    def _forget(self, names) -> None:
        known = cache.get(self._registry()) or {}
        if any(name in known for name in names):
            cache.set(self._registry(), {k: v for k, v in known.items() if k not in names}, timeout=None)

    def open_for(self, name: str) -> float:
        """Seconds the breaker stays open, or 0 (also while the shared cache is unreachable)."""
        state = tolerant(lambda: cache.get(self._key(name)), None) or {}
        return max(0.0, state.get("open_until", 0) - time.time())

    def record(self, name: str, ok: bool) -> None:
        tolerant(lambda: self._record(name, ok), None)

    def _record(self, name: str, ok: bool) -> None:
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
            # Names that have opened, so they can be listed (the cache cannot be searched by prefix);
            # a closed one stays in the set, cheap to skip, until it is reset.
            known = cache.get(self._registry()) or {}
            known[name] = state["open_until"]
            cache.set(self._registry(), known, timeout=None)
        cache.set(key, state, timeout=max(60, int(seconds) + 1))


def rate_wait(name: str, per_minute: int | None) -> float:
    """Count one call of ``name``: 0 if it may go now (or the shared cache is unreachable), else the
    seconds until the window turns."""
    if not per_minute:
        return 0.0
    return tolerant(lambda: _rate_count(name, per_minute), 0.0)


def _rate_count(name: str, per_minute: int) -> float:
    key = f"warden:rate:{name}:{int(time.time() // 60)}"
    cache.add(key, 0, timeout=120)
    try:
        count = cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout=120)
        count = 1
    return 0.0 if count <= per_minute else 60 - time.time() % 60
