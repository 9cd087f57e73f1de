"""Limits kept in the shared cache (Redis in scaled mode), so every worker sees them, for tools
(tools/broker.py) and model providers (agents/gateway.py) alike: a circuit breaker and a rate limit (a
fixed one-minute window).

Each is kept per *breaker*: a project's own tool (an HTTP or MCP tool it declared) has one of its own,
so another project's tool of the same name never opens it nor uses up its calls; Warden's registry tools
and the model providers are the deployment's, one each for every project.

A breaker is **closed** until enough failures in a row **open** it; open, it refuses calls for its open
period; then it is **half-open**: the next call is its probe (one at a time), whose success closes it and
whose failure opens it again. The opening (closed → open) and a probe's success are announced on core.bus
(approvals pages people; the engine resumes the tasks the breaker parked).
"""

import logging
import math
import re
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache

from core import bus
from core.cache import tolerant

log = logging.getLogger("warden.circuit")

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
# A half-open breaker that nothing probes is forgotten (read as closed) this long after its open period.
HALF_OPEN_KEPT_SECONDS = 24 * 3600


@dataclass(frozen=True)
class BreakerRef:
    """Which breaker: a tool's or a provider's, of one project (``project_id``) or of the deployment (None)."""

    what: str  # tool, provider
    name: str
    project_id: int | None = None

    @property
    def key(self) -> str:
        return self.name if self.project_id is None else f"{self.project_id}/{self.name}"


@dataclass(frozen=True)
class BreakerState:
    ref: BreakerRef
    state: str  # closed, open, half_open
    seconds_left: float = 0.0  # of the open period
    opened_at: float | None = None  # when this opening began (a probe's failure does not change it)


class Breaker:
    def __init__(self, *, what: str, prefix: str, failures_setting: str, open_setting: str):
        self.what, self.prefix = what, prefix
        self.failures_setting, self.open_setting = failures_setting, open_setting

    def ref(self, name: str, project_id: int | None = None) -> BreakerRef:
        return BreakerRef(self.what, name, project_id)

    def _key(self, ref: BreakerRef) -> str:
        return f"{self.prefix}:{ref.key}"

    def _registry(self) -> str:
        return f"{self.prefix}:opened"

    def _open_seconds(self) -> float:
        return settings.WARDEN[self.open_setting]

    # --- reading ---------------------------------------------------------------------------------------
    def state(self, name: str, *, project_id: int | None = None) -> BreakerState:
        """Closed also while the shared cache is unreachable."""
        ref = self.ref(name, project_id)
        return self._state(ref, tolerant(lambda: cache.get(self._key(ref)), None) or {})

    def _state(self, ref: BreakerRef, raw: dict) -> BreakerState:
        until = raw.get("open_until", 0)
        if not until:
            return BreakerState(ref, CLOSED)
        left = until - time.time()
        return BreakerState(ref, OPEN if left > 0 else HALF_OPEN, max(0.0, left), raw.get("opened_at"))

    def open_for(self, name: str, *, project_id: int | None = None) -> float:
        """Seconds the breaker stays open, or 0 (half-open, closed, or the cache unreachable)."""
        return self.state(name, project_id=project_id).seconds_left

    def open_now(self) -> list[BreakerState]:
        """Each breaker open or half-open now: what the inbox, the workers page and /metrics list."""
        known = tolerant(lambda: cache.get(self._registry()), None) or {}
        refs = [self._ref_of(key, entry) for key, entry in known.items()]
        raw = tolerant(lambda: cache.get_many([self._key(ref) for ref in refs]), None) or {}
        states = [self._state(ref, raw.get(self._key(ref)) or {}) for ref in refs]
        return sorted((s for s in states if s.state != CLOSED), key=lambda s: (s.ref.project_id or 0, s.ref.name))

    def _ref_of(self, key: str, entry) -> BreakerRef:
        if isinstance(entry, dict):
            return self.ref(entry["name"], entry.get("project_id"))
        return self.ref(key)  # written before breakers were kept per project: the deployment's

    # --- calling ---------------------------------------------------------------------------------------
    def admit(self, name: str, *, project_id: int | None = None) -> float:
        """0 when a call may go now (closed; or half-open, and this call is its probe), else the seconds
        to wait. The cache unreachable: 0."""
        return tolerant(lambda: self._admit(self.ref(name, project_id)), 0.0)

    def _admit(self, ref: BreakerRef) -> float:
        key, now = self._key(ref), time.time()
        until = (cache.get(key) or {}).get("open_until", 0)
        if not until:
            return 0.0
        if now < until:
            return until - now
        # Half-open: one probe at a time. Its claim lapses after an open period, should its caller die.
        seconds = self._open_seconds()
        if cache.add(f"{key}:probe", now + seconds, timeout=math.ceil(seconds) + 1):
            log.info("%s: half-open, this call is the probe", key)
            return 0.0
        return max(1.0, (cache.get(f"{key}:probe") or now + 1) - now)

    def probe_release(self, name: str, *, project_id: int | None = None) -> None:
        """A call whose outcome tells nothing of the system's health (a refusal of its arguments) gives
        back the probe's turn it may have held, so that the next call probes the half-open breaker."""
        ref = self.ref(name, project_id)
        tolerant(lambda: cache.delete(f"{self._key(ref)}:probe"), None)

    def record(self, name: str, ok: bool, *, project_id: int | None = None) -> None:
        tolerant(lambda: self._record(self.ref(name, project_id), ok), None)

    def _record(self, ref: BreakerRef, ok: bool) -> None:
        key = self._key(ref)
        state = cache.get(key)
        if ok:
            # Of several successes at once, the one whose delete removed the state announces the close.
            if state is not None and cache.delete(key):
                cache.delete_many([f"{key}:probe", f"{key}:opening"])
                self._forget([ref.key])
                if state.get("open_until"):
                    log.info("%s: closed by a successful call", key)
                    bus.breaker_closed(ref)
            return
        self._failed(ref, key, state or {"failures": 0, "open_until": 0})

    def _failed(self, ref: BreakerRef, key: str, state: dict) -> None:
        limit, seconds, now = settings.WARDEN[self.failures_setting], self._open_seconds(), time.time()
        kept = math.ceil(seconds) + HALF_OPEN_KEPT_SECONDS
        if state["open_until"]:
            if now < state["open_until"]:
                return  # a call let through before it opened: it is open already
            # The probe failed: open again, the same opening (people were told once).
            state = {**state, "open_until": now + seconds}
            cache.set(key, state, timeout=kept)
            cache.delete(f"{key}:probe")
            cache.touch(f"{key}:opening", kept)
            log.warning("%s: the probe failed, open again for %ss", key, seconds)
            return
        state["failures"] += 1
        if state["failures"] < limit:
            cache.set(key, state, timeout=max(60, math.ceil(seconds) + 1))
            if state["failures"] == 1:
                self._remember(ref)
            return
        state = {"failures": 0, "open_until": now + seconds, "opened_at": now}
        cache.set(key, state, timeout=kept)
        self._remember(ref)
        log.warning("%s: breaker open for %ss", key, seconds)
        # Two workers may both see the last failure: only the first to mark the opening announces it.
        if cache.add(f"{key}:opening", now, timeout=kept):
            bus.breaker_opened(ref, opened_at=now)

    # Breakers with a state, so they can be listed and reset (the cache cannot be searched by prefix):
    # one is forgotten when it closes, or, once its state expired, when another is remembered (a
    # failure: the rare path pays for the pruning).
    def _remember(self, ref: BreakerRef) -> None:
        known = cache.get(self._registry()) or {}
        if ref.key in known:
            return
        alive = cache.get_many([f"{self.prefix}:{key}" for key in known])
        known = {k: v for k, v in known.items() if f"{self.prefix}:{k}" in alive}
        known[ref.key] = {"name": ref.name, "project_id": ref.project_id}
        cache.set(self._registry(), known, timeout=None)

    def _forget(self, keys) -> None:
        known = cache.get(self._registry()) or {}
        if any(key in known for key in keys):
            cache.set(self._registry(), {k: v for k, v in known.items() if k not in keys}, timeout=None)

    # --- by hand and by the sweeper --------------------------------------------------------------------
    def reset(self, names, *, project_id: int | None = None) -> None:
        """Close by hand (a person, a test): nothing is announced; the caller resumes what it parked."""
        refs = [self.ref(name, project_id) for name in names]
        keys = [self._key(ref) for ref in refs]
        tolerant(lambda: cache.delete_many([f"{k}{s}" for k in keys for s in ("", ":probe", ":opening", ":sweep")]),
                 None)  # fmt: skip
        tolerant(lambda: self._forget([ref.key for ref in refs]), None)

    def reset_all(self) -> None:
        """Every breaker this deployment has a state for (tests, and a deployment starting afresh)."""
        known = tolerant(lambda: cache.get(self._registry()), None) or {}
        for key, entry in known.items():
            ref = self._ref_of(key, entry)
            self.reset([ref.name], project_id=ref.project_id)

    def probe_due(self, name: str, *, project_id: int | None = None) -> bool:
        """True at most once per open period for a breaker: the sweeper's turn to make it a probe call
        (by retrying one task it parked) when nothing else calls the tool."""
        key = self._key(self.ref(name, project_id))
        seconds = self._open_seconds()
        return bool(tolerant(lambda: cache.add(f"{key}:sweep", 1, timeout=max(1, math.ceil(seconds))), False))


def rate_wait(name: str, per_minute: int | None) -> float:
    """Count one call of ``name`` (a tool's breaker key, ``model:<provider>``): 0 if it may go now (or the
    shared cache is unreachable), else the seconds until the window turns."""
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


# --- the tasks a breaker parked ---------------------------------------------------------------------------
# A task refused by an open breaker fails with this reason (class breaker, or provider for a model
# provider's) and its run needs attention; the engine finds the tasks a breaker parked by it.
_PARKED = re.compile(r"^the (tool|provider) (\S+)( of project \S+)? is failing: ")


def breaker_reason(ref: BreakerRef, wait: float, *, project: str = "") -> str:
    """``project``: the slug of a project's own tool's project, named for the people who read it."""
    whose = f" of project {project or ref.project_id}" if ref.project_id is not None else ""
    return f"the {ref.what} {ref.name}{whose} is failing: its breaker is open for another {wait:.0f}s"


def parked_by(reason: str, *, project_id: int) -> BreakerRef | None:
    """The breaker that parked a task of a run of ``project_id`` with this reason, if one did."""
    match = _PARKED.match(reason or "")
    if match is None:
        return None
    what, name, own = match.groups()
    return BreakerRef(what, name, project_id if own else None)


def parked_prefix(ref: BreakerRef) -> str:
    """What the reasons of the tasks ``ref`` parked start with (to narrow a query; parked_by decides)."""
    return f"the {ref.what} {ref.name} "
