"""Warden's own Prometheus metrics: the counters and histograms each process adds to as it works.

Every process (the ASGI server, each ``rundramatiq`` worker) writes them to files in
``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's multiprocess mode, set by the settings before this module
is imported); ``GET /metrics`` adds the files of every process of the host together, and figures read from
the database or the queue at scrape time (runs by status, backlogs, ages) come from a collector of the
dashboard's (dashboard/telemetry.py). Label values are bounded: never a run or task id (docs/operations.md
lists each label set).
"""

import os
import re
import threading

from prometheus_client import Counter, Histogram
from prometheus_client import multiprocess as prometheus_multiprocess

# Seconds: a step is a few ms of database work around a model or tool call that may take a minute.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

STEPS = Counter("warden_steps", "Journaled steps, by kind and outcome", ["kind", "outcome"])
STEP_SECONDS = Histogram(
    "warden_step_duration_seconds", "A step's model or tool call until journaled", ["kind"], buckets=LATENCY_BUCKETS
)
HOP_SECONDS = Histogram(
    "warden_hop_seconds",
    "A queue message from its enqueue until a worker picks it up",
    ["actor"],
    buckets=LATENCY_BUCKETS,
)
MESSAGES = Counter("warden_messages", "Queue messages processed by workers, by actor and outcome", ["actor", "outcome"])
MODEL_CALLS = Counter("warden_model_calls", "Model calls, by provider and outcome", ["provider", "outcome"])
TOOL_CALLS = Counter(
    "warden_tool_calls",
    "Tool calls, by tool (and project, for a project's own tool) and outcome",
    ["project", "tool", "outcome"],
)
TOKENS = Counter("warden_tokens", "Model tokens, by provider and direction (in, out)", ["provider", "direction"])
COST = Counter("warden_cost_usd", "Model cost in US dollars, by provider", ["provider"])
RUNS_FINISHED = Counter("warden_runs_finished", "Runs that reached a final status, by status", ["status"])
QUARANTINED = Counter("warden_quarantined_results", "Late results kept apart, never applied, by reason", ["reason"])
LEASE_EXPIRIES = Counter("warden_lease_expiries", "Attempts whose worker lost its lease (taken over or recovered)")
SWEEP_ACTIONS = Counter("warden_sweeper_actions", "What the recovery sweeper did, by action", ["action"])
SWEEP_SECONDS = Histogram("warden_sweeper_pass_seconds", "One pass of the recovery sweeper", buckets=LATENCY_BUCKETS)
WEBHOOKS = Counter("warden_webhook_deliveries", "Webhook delivery attempts, by outcome", ["outcome"])

_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,64}$")
_MAX_VALUES = 200  # distinct values of one free-form label (tool names, providers) per process
_seen: set[str] = set()
_seen_lock = threading.Lock()


def bounded(value) -> str:
    """A label value that came from configuration or a model (a tool name the model made up): kept as is
    while it looks like a name and this process has seen fewer than _MAX_VALUES of them, else "other"."""
    value = str(value or "")
    return value if _NAME.match(value) and _seen_or_room(value) else "other"


def bounded_pair(project, name) -> tuple[str, str]:
    """A project's own tool as two label values, bounded as a pair (one value of the same budget), so that
    projects × tools cannot grow without bound either; past the bound, or not names, both are "other"."""
    project, name = str(project or ""), str(name or "")
    if _NAME.match(project) and _NAME.match(name) and _seen_or_room(f"{project}\n{name}"):
        return project, name
    return "other", "other"


def _seen_or_room(value: str) -> bool:
    with _seen_lock:
        if value not in _seen:
            if len(_seen) >= _MAX_VALUES:
                return False
            _seen.add(value)
    return True


def multiprocess() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def process_exited(pid: int | None = None) -> None:
    """A process stops: its live gauges go (its counters stay in the sum, as Prometheus expects)."""
    if multiprocess():
        prometheus_multiprocess.mark_process_dead(pid or os.getpid())
