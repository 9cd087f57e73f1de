"""Test settings: the same code path, with short timings so recovery drills finish quickly."""

import os
import sys

os.environ.setdefault("WARDEN_VAR_DIR", str(__import__("pathlib").Path(__file__).resolve().parents[2] / "var" / "test"))

# Each test session has its own queues, which the worker processes it starts inherit.
os.environ.setdefault("WARDEN_QUEUE_NAMESPACE", f"warden-test-{os.getpid()}")

# Each session's own metrics files (core/metrics.py), shared with the worker processes it starts and
# removed when it ends (tests/conftest.py).
os.environ.setdefault(
    "PROMETHEUS_MULTIPROC_DIR", os.path.join(os.environ["WARDEN_VAR_DIR"], f"prometheus-{os.getpid()}")
)

from .base import *  # noqa: E402,F401,F403
from .base import BASE_DIR, DATABASES, VAR_DIR, WARDEN  # noqa: E402

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # A file, not memory: crash drills run real server processes that must see the same database.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}

# Short timings so recovery drills finish quickly; an explicit WARDEN_* variable still wins, so a test
# can give the processes it starts other timings.
for _key, _value in {
    "RETRY_BASE_SECONDS": 0.05,
    "RETRY_CAP_SECONDS": 0.5,
    "REDRIVE_AFTER_SECONDS": 1.0,
    "OUTBOX_RESEND_AFTER_SECONDS": 1.0,
    "SWEEP_INTERVAL_SECONDS": 0.2,
    "CANCEL_GRACE_SECONDS": 2.0,
    "WEBHOOK_RETRY_BASE_SECONDS": 0.2,
    "MODEL_RETRY_BASE_SECONDS": 0.05,
    "MODEL_RETRY_CAP_SECONDS": 2.0,
    "MODEL_TIMEOUT_SECONDS": 5.0,
    # Tests receive webhooks on 127.0.0.1; the tests of the rule itself turn it off.
    "WEBHOOK_ALLOW_PRIVATE": True,
    # One id for the whole session, whatever a flush of the database does to the stored one (the
    # worker processes a test starts must use the keys the test computes).
    "INSTALLATION_ID": "itest",
    # HTTP tools and MCP servers the tests start on this machine (tests/tools/test_http_tools.py, test_mcp_tools.py).
    "HTTP_TOOL_HOSTS": ["127.0.0.1"],
    "MCP_COMMANDS": {
        "tickets": {
            "argv": [sys.executable, str(BASE_DIR / "examples" / "refunds" / "tickets_mcp.py")],
            # where the test's server writes what it did, and every call it got, for the test to count
            "env": ["TICKETS_EFFECTS", "TICKETS_CALLS"],
        }
    },
}.items():
    if f"WARDEN_{_key}" not in os.environ:
        WARDEN[_key] = _value
