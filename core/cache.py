"""The shared cache (Redis in scaled mode) holds only what Warden can do without for a while: circuit
breakers, rate-limit windows, the dashboard's sequence numbers and viewers. While Redis is away, a step
goes on (breakers read as closed, limits as not reached) and a page still renders from the database,
rather than a task failing or a page answering 500 because of the cache. The database stays the truth."""

import logging
import time

log = logging.getLogger("warden.cache")
_last_warning = [0.0]


def tolerant(call, default):
    """``call()``, or ``default`` when the shared cache cannot be reached (logged at most every 10 s)."""
    from redis.exceptions import RedisError

    try:
        return call()
    except (RedisError, OSError) as exc:
        if time.monotonic() - _last_warning[0] > 10:
            _last_warning[0] = time.monotonic()
            log.warning("the shared cache is unreachable (%r); going on without it", exc)
        return default
