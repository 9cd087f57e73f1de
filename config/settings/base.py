"""Settings shared by every environment.

The mode follows the environment: with no DATABASE_URL / REDIS_URL Warden runs embedded (SQLite in WAL
mode, Dramatiq worker threads inside the server, in-memory channel layer); with them it runs scaled
(PostgreSQL, Redis broker, channels-redis, workers started by ``manage.py rundramatiq``).
"""

import json
import os
import re
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url
from csp.constants import NONCE
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(os.environ.get("WARDEN_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def _secret_grants() -> dict[str, list[str]]:
    """WARDEN_SECRET_GRANTS: {"SECRET_NAME": ["project-slug", ...]}, which projects' HTTP tools and MCP
    servers may name each secret (docs/tools.md, "Secrets"). A malformed value stops the start: a
    half-read catalogue would grant less, or more, than the deployment meant."""
    raw = os.environ.get("WARDEN_SECRET_GRANTS", "").strip()
    if not raw:
        return {}
    shape = '{"SECRET_NAME": ["project-slug", ...]}'
    try:
        grants = json.loads(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"WARDEN_SECRET_GRANTS is not JSON ({exc}): it must be {shape}") from None
    if not isinstance(grants, dict):
        raise ImproperlyConfigured(f"WARDEN_SECRET_GRANTS must be a JSON object {shape}")
    for name, slugs in grants.items():
        if not re.fullmatch(r"[A-Z][A-Z0-9_]{0,127}", name):
            raise ImproperlyConfigured(
                f"WARDEN_SECRET_GRANTS: {name!r} is not a secret name (upper case letters, digits, _)"
            )
        if not isinstance(slugs, list) or not all(
            isinstance(s, str) and re.fullmatch(r"[-a-zA-Z0-9_]+", s) for s in slugs
        ):
            raise ImproperlyConfigured(
                f'WARDEN_SECRET_GRANTS[{name!r}] must be a list of project slugs, e.g. ["payments"]'
            )
    return grants


def _secret_key() -> str:
    if os.environ.get("DJANGO_SECRET_KEY"):
        return os.environ["DJANGO_SECRET_KEY"]
    # Embedded mode keeps a generated key on disk so sessions survive restarts.
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()

# prometheus_client's multiprocess mode (core/metrics.py): each process writes its counters to files here
# and GET /metrics adds up those of every process on the host. Read when prometheus_client is first
# imported, so set before any app loads. Empty it when the host's processes start (docs/operations.md).
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(VAR_DIR / "prometheus"))
Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]).mkdir(parents=True, exist_ok=True)
DEBUG = os.environ.get("DJANGO_DEBUG", "0") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost").split(",")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "template_partials",
    "ninja",  # serves the API docs' Swagger UI from our own static files, not a CDN
    "django_htmx",  # htmx itself, vendored in the package's static files (no CDN at run time)
    "channels",
    "django_dramatiq",
    "axes",  # login throttling (django-axes); before tenancy, whose admin keeps its pages to superusers
    "tenancy",  # projects, memberships, tokens, the audit log: imported by every app, imports none
    "policy",  # approval policies, waivers, allow rules, requests and decisions: below the broker and the engine
    "runs",
    "agents",
    "integrations",  # webhooks, OTLP both ways, external agents, the API's idempotency: above the engine
    "tools",
    "approvals",
    "saga",  # the supervisor's executor and compensation, above the engine
    "evals",  # reference evaluations, above the engine
    "replay",  # what-if replays of past runs on a candidate agent: above the engine and the evaluations
    "dashboard",  # pages, live push and insight: on top, imported by no app below it
]

MIDDLEWARE = [
    "core.logs.RequestIdMiddleware",  # first: every later line of the request carries its id
    "tenancy.proxies.UnnamedProxyMiddleware",  # notes a proxy WARDEN_TRUSTED_PROXY_COUNT does not name
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "integrations.idempotency.IdempotencyMiddleware",
    "axes.middleware.AxesMiddleware",  # answers a locked-out login with the lockout page
]

# A strict policy for Warden's own pages: scripts only from our static files, each tag carrying the
# request's nonce; no inline script, style or eval (htmx runs with allowEval=false). The admin and the
# API's Swagger page are Django's and ninja's own pages, kept under their own defaults.
CONTENT_SECURITY_POLICY = {
    "EXCLUDE_URL_PREFIXES": ["/admin/", "/api/v1/docs"],
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'", NONCE],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}
X_FRAME_OPTIONS = "DENY"

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "dashboard.context_processors.nav",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------------
DATABASE_URL = os.environ.get("DATABASE_URL", "")
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)}
    if DATABASES["default"]["ENGINE"].endswith("postgresql"):
        # Lets the engine's hot-path statements be prepared once per connection (runs/services/sql.py);
        # planning them costs more than running them. Behind PgBouncer use session pooling.
        DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 5
        # A database host that does not answer (not one that refuses) must not hang a request, a readiness
        # probe or a worker for libpq's default of forever.
        DATABASES["default"]["OPTIONS"].setdefault("connect_timeout", 5)
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("WARDEN_SQLITE_PATH", str(VAR_DIR / "warden.sqlite3")),
            "OPTIONS": {
                # IMMEDIATE takes the write lock at BEGIN, so two writers queue on the busy timeout
                # instead of failing with "database is locked" when a read upgrades to a write.
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=30000;",
            },
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
WARDEN_SCALED = bool(os.environ.get("REDIS_URL"))

# --- Queue (Dramatiq) -----------------------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "")
# Only what the engine uses: every middleware runs on every message.
_dramatiq_middleware = [
    "dramatiq.middleware.TimeLimit",
    "dramatiq.middleware.Retries",  # present so actors can say max_retries=0: the engine retries
    "django_dramatiq.middleware.DbConnectionsMiddleware",
]  # and the recovery sweeper's, added by runs/apps.py once the models are loaded
if os.environ.get("WARDEN_CHAOS_DUPLICATE_DELIVERY") == "1":  # fault drills only: docs/operations.md
    _dramatiq_middleware.append("runs.middleware.DuplicateDelivery")
if REDIS_URL:
    DRAMATIQ_BROKER = {
        "BROKER": "core.queue.WakingRedisBroker",  # idle workers woken by new work (core/queue.py)
        # Timeouts: a Redis that stops answering must not hang a request or a worker (the outbox keeps
        # what could not be sent).
        "OPTIONS": {
            "url": REDIS_URL,
            "namespace": os.environ.get("WARDEN_QUEUE_NAMESPACE", "warden"),
            "socket_timeout": 5,
            "socket_connect_timeout": 5,
        },
        "MIDDLEWARE": _dramatiq_middleware,
    }
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": "warden:channels", "group_expiry": 3600},
        }
    }
    # Shared by every worker: tools' rate limits and circuit breakers.
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": os.environ.get("WARDEN_QUEUE_NAMESPACE", "warden"),
            "OPTIONS": {"socket_timeout": 5, "socket_connect_timeout": 5},
        }
    }
else:
    DRAMATIQ_BROKER = {
        "BROKER": "dramatiq.brokers.stub.StubBroker",
        "OPTIONS": {},
        "MIDDLEWARE": _dramatiq_middleware,
    }
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
DRAMATIQ_AUTODISCOVER_MODULES = ["actors"]
# An idle Redis consumer backs off up to twice this before it looks for messages again; Dramatiq's
# default (1 s) would let a new run wait up to 2 s. Read by `rundramatiq` workers, which inherit it.
os.environ.setdefault("dramatiq_worker_timeout", os.environ.get("WARDEN_QUEUE_POLL_MS", "100"))
DRAMATIQ_TASKS_DATABASE = "default"

# --- Engine ---------------------------------------------------------------------------------------
WARDEN = {
    # A lease is renewed by every step and by a heartbeat; an expired one can be taken over.
    "LEASE_SECONDS": _env_float("WARDEN_LEASE_SECONDS", 30),
    "HEARTBEAT_SECONDS": _env_float("WARDEN_HEARTBEAT_SECONDS", 0),  # 0: a third of the lease
    "SWEEP_INTERVAL_SECONDS": _env_float("WARDEN_SWEEP_INTERVAL_SECONDS", 1.0),
    # A ready task whose message has not been picked up for this long is re-driven by the sweeper.
    "REDRIVE_AFTER_SECONDS": _env_float("WARDEN_REDRIVE_AFTER_SECONDS", 10),
    "OUTBOX_RESEND_AFTER_SECONDS": _env_float("WARDEN_OUTBOX_RESEND_AFTER_SECONDS", 5),
    "CANCEL_GRACE_SECONDS": _env_float("WARDEN_CANCEL_GRACE_SECONDS", 15),
    "RETRY_BASE_SECONDS": _env_float("WARDEN_RETRY_BASE_SECONDS", 1.0),
    "RETRY_CAP_SECONDS": _env_float("WARDEN_RETRY_CAP_SECONDS", 60),
    # Lease expiries (crashes) a task may suffer beyond its max_attempts before it needs a human.
    "MAX_RECOVERIES": int(os.environ.get("WARDEN_MAX_RECOVERIES", 3)),
    "LOOP_GUARD_REPEATS": int(os.environ.get("WARDEN_LOOP_GUARD_REPEATS", 3)),
    # Replies in a row whose tool calls the systems refused (the model was told) before the task fails.
    "MAX_CONSECUTIVE_REFUSALS": int(os.environ.get("WARDEN_MAX_CONSECUTIVE_REFUSALS", 3)),
    "MAX_TASKS_PER_RUN": int(os.environ.get("WARDEN_MAX_TASKS_PER_RUN", 200)),
    "MAX_CONCURRENT_TASKS_PER_RUN": int(os.environ.get("WARDEN_MAX_CONCURRENT_TASKS_PER_RUN", 8)),
    "MAX_PLANNING_DEPTH": int(os.environ.get("WARDEN_MAX_PLANNING_DEPTH", 2)),
    # How many tasks one plan of a planner agent may add at once (static plans are trusted configuration).
    "MAX_PLAN_FANOUT": int(os.environ.get("WARDEN_MAX_PLAN_FANOUT", 50)),
    # A worker that has run one attempt this long hands the rest to a fresh message between steps.
    "SLICE_SECONDS": _env_float("WARDEN_SLICE_SECONDS", 20),
    # Dramatiq's time limit for an actor; defaults to 90% of the lease (see runs/actors.py).
    "ACTOR_TIME_LIMIT_SECONDS": _env_float("WARDEN_ACTOR_TIME_LIMIT_SECONDS", 0),
    "EMBEDDED_WORKER_THREADS": int(os.environ.get("WARDEN_WORKER_THREADS", 4)),
    # Stamped on every run and compared before a resume: a run paused across a deploy is not resumed
    # silently under different code.
    "CODE_VERSION": os.environ.get("WARDEN_CODE_VERSION", "warden-0.1.0"),
    # This installation's id in idempotency keys: empty, the one generated and stored with the database;
    # set it to keep an installation's id on a new database (docs/tools.md, "Idempotency keys").
    "INSTALLATION_ID": os.environ.get("WARDEN_INSTALLATION_ID", ""),
    # Tools: consecutive failures that open a tool's circuit, and for how long it stays open.
    "TOOL_CIRCUIT_FAILURES": int(os.environ.get("WARDEN_TOOL_CIRCUIT_FAILURES", 5)),
    "TOOL_CIRCUIT_OPEN_SECONDS": _env_float("WARDEN_TOOL_CIRCUIT_OPEN_SECONDS", 30),
    # A task's prompt: its steps' records beyond this many characters are dropped, oldest first.
    "CONTEXT_CHARS": int(os.environ.get("WARDEN_CONTEXT_CHARS", 12000)),
    # The model gateway (agents/gateway.py): retries of 429, 5xx and timeouts, and a breaker per provider.
    "MODEL_RETRIES": int(os.environ.get("WARDEN_MODEL_RETRIES", 3)),
    "MODEL_RETRY_BASE_SECONDS": _env_float("WARDEN_MODEL_RETRY_BASE_SECONDS", 1.0),
    "MODEL_RETRY_CAP_SECONDS": _env_float("WARDEN_MODEL_RETRY_CAP_SECONDS", 30),
    "MODEL_TIMEOUT_SECONDS": _env_float("WARDEN_MODEL_TIMEOUT_SECONDS", 120),
    "MODEL_CIRCUIT_FAILURES": int(os.environ.get("WARDEN_MODEL_CIRCUIT_FAILURES", 5)),
    "MODEL_CIRCUIT_OPEN_SECONDS": _env_float("WARDEN_MODEL_CIRCUIT_OPEN_SECONDS", 60),
    # Calls a minute per provider, across all workers (0 or absent: no limit), e.g. "openai=500,anthropic=50".
    "MODEL_RATE_PER_MINUTE": {
        name: int(limit)
        for name, _, limit in (
            part.partition("=") for part in os.environ.get("WARDEN_MODEL_RATE_PER_MINUTE", "").split(",") if part
        )
    },
    # An OpenAI-compatible endpoint; the key is read from the environment at each call, never stored.
    "OPENAI_BASE_URL": os.environ.get("WARDEN_OPENAI_BASE_URL", "https://api.openai.com/v1"),
    "OPENAI_API_KEY_ENV": os.environ.get("WARDEN_OPENAI_API_KEY_ENV", "OPENAI_API_KEY"),
    # That endpoint takes max_tokens, not max_completion_tokens (an agent's own endpoint says so itself).
    "OPENAI_SEND_MAX_TOKENS": os.environ.get("WARDEN_OPENAI_SEND_MAX_TOKENS", "").lower() in ("1", "true", "yes"),
    "ANTHROPIC_BASE_URL": os.environ.get("WARDEN_ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
    "ANTHROPIC_API_KEY_ENV": os.environ.get("WARDEN_ANTHROPIC_API_KEY_ENV", "ANTHROPIC_API_KEY"),
    # The most a model may answer with, asked of every provider and reserved against budgets before each
    # call (WARDEN_ANTHROPIC_MAX_TOKENS is its older name, still read); the scripted models answer shortly.
    "MODEL_MAX_OUTPUT_TOKENS": int(
        os.environ.get("WARDEN_MODEL_MAX_OUTPUT_TOKENS", os.environ.get("WARDEN_ANTHROPIC_MAX_TOKENS", 4096))
    ),
    "SCRIPTED_MAX_OUTPUT_TOKENS": int(os.environ.get("WARDEN_SCRIPTED_MAX_OUTPUT_TOKENS", 256)),
    # A prompt's worst case in tokens: its characters over this (tokenisers average about 4 per token).
    "PROMPT_CHARS_PER_TOKEN": _env_float("WARDEN_PROMPT_CHARS_PER_TOKEN", 4),
    # A call that does not fit beside its siblings' reservations waits this long for them to settle, then
    # hands its slice back to the queue; one that would not fit even alone is refused.
    "BUDGET_WAIT_SECONDS": _env_float("WARDEN_BUDGET_WAIT_SECONDS", 5),
    # Integration API: Idempotency-Key records are kept this long (at least 72 h); one whose request died
    # is free again after IN_FLIGHT seconds. Requests per token and minute before a 429.
    "IDEMPOTENCY_KEEP_HOURS": _env_float("WARDEN_IDEMPOTENCY_KEEP_HOURS", 72),
    "IDEMPOTENCY_IN_FLIGHT_SECONDS": _env_float("WARDEN_IDEMPOTENCY_IN_FLIGHT_SECONDS", 60),
    "API_RATE_PER_MINUTE": int(os.environ.get("WARDEN_API_RATE_PER_MINUTE", 600)),
    # Outbound webhooks: attempts before a delivery is given up (the admin can send it again), backoff.
    "WEBHOOK_MAX_ATTEMPTS": int(os.environ.get("WARDEN_WEBHOOK_MAX_ATTEMPTS", 8)),
    "WEBHOOK_RETRY_BASE_SECONDS": _env_float("WARDEN_WEBHOOK_RETRY_BASE_SECONDS", 5),
    "WEBHOOK_RETRY_CAP_SECONDS": _env_float("WARDEN_WEBHOOK_RETRY_CAP_SECONDS", 3600),
    "WEBHOOK_TIMEOUT_SECONDS": _env_float("WARDEN_WEBHOOK_TIMEOUT_SECONDS", 5),
    # Logins (django-axes, below): failures before a lockout, per username and client address and per
    # client address alone, and how long it lasts.
    "LOGIN_FAILURES_LIMIT": int(os.environ.get("WARDEN_LOGIN_FAILURES_LIMIT", 5)),
    "LOGIN_LOCKOUT_SECONDS": _env_float("WARDEN_LOGIN_LOCKOUT_SECONDS", 300),
    # Behind a reverse proxy: the header it puts the client's address in, and how many proxies stand in
    # front of Warden (the client is that many entries from the right). 0: no proxy, REMOTE_ADDR is the
    # client (a header a client could set is never trusted then).
    "TRUSTED_PROXY_COUNT": int(os.environ.get("WARDEN_TRUSTED_PROXY_COUNT", 0)),
    "CLIENT_IP_HEADER": os.environ.get("WARDEN_CLIENT_IP_HEADER", "HTTP_X_FORWARDED_FOR"),
    # Approvals: links in notifications, and the webhook (signed with the secret) told of each request.
    "BASE_URL": os.environ.get("WARDEN_BASE_URL", "http://127.0.0.1:8000"),
    "APPROVAL_WEBHOOK_URL": os.environ.get("WARDEN_APPROVAL_WEBHOOK_URL", ""),
    "APPROVAL_WEBHOOK_SECRET": os.environ.get("WARDEN_APPROVAL_WEBHOOK_SECRET", ""),
    "APPROVAL_WEBHOOK_SLACK": os.environ.get("WARDEN_APPROVAL_WEBHOOK_SLACK", "") == "1",
    # The longest an allow rule stands; a rule asked for without an end gets this one (docs/access.md).
    "ALLOW_RULE_MAX_DAYS": _env_float("WARDEN_ALLOW_RULE_MAX_DAYS", 30),
    # Webhook and notification URLs may point at loopback, private, link-local or metadata addresses only
    # when this is set (tests, a receiver on the same machine); refused otherwise (core/outbound.py).
    "WEBHOOK_ALLOW_PRIVATE": os.environ.get("WARDEN_WEBHOOK_ALLOW_PRIVATE", "") == "1",
    # The sandbox systems' tools (tools/sandbox_tools.py) and their effects listing (GET
    # /api/v1/sandbox/effects): for the demos and the drills; off where real tools run.
    "SANDBOX_TOOLS": os.environ.get("WARDEN_SANDBOX_TOOLS", "1") == "1",
    # OTLP trace ingest (api/otlp.py): the most a request may carry, and the external workflow a new
    # trace's run starts in when its spans name none (warden.workflow).
    "OTLP_MAX_BYTES": int(os.environ.get("WARDEN_OTLP_MAX_BYTES", 4 * 1024 * 1024)),
    "OTLP_MAX_SPANS": int(os.environ.get("WARDEN_OTLP_MAX_SPANS", 5000)),
    "OTLP_WORKFLOW": os.environ.get("WARDEN_OTLP_WORKFLOW", "external-agent"),
    # A team's own tool modules, comma-separated dotted paths (docs/tools.md, "Python tools").
    "TOOL_MODULES": [m.strip() for m in os.environ.get("WARDEN_TOOL_MODULES", "").split(",") if m.strip()],
    # Hosts HTTP tools and MCP servers declared in the admin may call ("host" or "host:port"), and the
    # commands a stdio MCP server may run ({"name": ["argv", ...]}): the deployment's word, not a project's.
    "HTTP_TOOL_HOSTS": [h.strip() for h in os.environ.get("WARDEN_HTTP_TOOL_HOSTS", "").split(",") if h.strip()],
    "MCP_COMMANDS": json.loads(os.environ.get("WARDEN_MCP_COMMANDS", "{}") or "{}"),
    # A process closes an MCP session (a stdio server stops) idle this long (tools/mcp_sessions.py).
    "MCP_SESSION_IDLE_SECONDS": _env_float("WARDEN_MCP_SESSION_IDLE_SECONDS", 300),
    # Where the broker reads the secrets tools name: a callable name -> value (default: the environment).
    "SECRET_SOURCE": os.environ.get("WARDEN_SECRET_SOURCE", "tools.secrets.environment_secret"),
    # Which projects may name each secret (tools/secrets.py); none: no project's HTTP tool or MCP server
    # may name any. Grants of Warden's own settings stop the start (tools.apps).
    "SECRET_GRANTS": _secret_grants(),
    # Drill faults in a run's input (docs/scenarios.md); they can kill a worker on purpose (off in production).
    "DRILL_FAULTS": os.environ.get("WARDEN_DRILL_FAULTS", "1") == "1",
    # Retention (runs/retention.py): bodies and payloads of runs finished this many days ago are pruned
    # (0: kept for good); the sweeper looks for such runs once per interval.
    "RETENTION_DAYS": int(os.environ.get("WARDEN_RETENTION_DAYS", 30)),
    "RETENTION_INTERVAL_SECONDS": _env_float("WARDEN_RETENTION_INTERVAL_SECONDS", 3600),
    # Set by config/settings/production.py: what `manage.py check --deploy` and `manage.py doctor` hold to.
    "PRODUCTION": False,
    # GET /metrics (docs/operations.md): a scraper presents this bearer token, or comes from one of these
    # networks (the client address as the audit log reads it, behind WARDEN_TRUSTED_PROXY_COUNT proxies).
    "METRICS_TOKEN": os.environ.get("WARDEN_METRICS_TOKEN", ""),
    "METRICS_ALLOW": [
        n.strip() for n in os.environ.get("WARDEN_METRICS_ALLOW", "127.0.0.1/32,::1/128").split(",") if n.strip()
    ],
    # A worker process whose registry row was not stamped for this long is shown as gone (workers page).
    "WORKER_GONE_SECONDS": _env_float("WARDEN_WORKER_GONE_SECONDS", 0),  # 0: the lease
}

# Refused rather than clamped: every process (server, workers, commands) reads these, and a client that
# retries a POST within three days is promised the first response (docs/api.md).
if WARDEN["IDEMPOTENCY_KEEP_HOURS"] < 72:
    raise ImproperlyConfigured(
        f"WARDEN_IDEMPOTENCY_KEEP_HOURS is {WARDEN['IDEMPOTENCY_KEEP_HOURS']:g}; Idempotency-Key records are "
        "kept at least 72 hours"
    )
if WARDEN["RETENTION_DAYS"] < 0:
    raise ImproperlyConfigured("WARDEN_RETENTION_DAYS must be 0 (keep everything) or a number of days")
if WARDEN["RETENTION_INTERVAL_SECONDS"] <= 0:
    raise ImproperlyConfigured("WARDEN_RETENTION_INTERVAL_SECONDS must be above 0")

# --- E-mail (approval notifications) ---------------------------------------------------------------
# Embedded mode prints e-mails to the console; set DJANGO_EMAIL_BACKEND / EMAIL_HOST for real delivery.
EMAIL_BACKEND = os.environ.get("DJANGO_EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = int(os.environ.get("EMAIL_PORT", 25))
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "warden@localhost")

# --- Auth, i18n, static ---
# django-axes first (it refuses a locked-out login before any password is checked).
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
# A lockout counts failures per (username, client address), which stops guessing one password, and per
# client address alone, which stops one password sprayed over many usernames. The client address comes
# from the trusted proxy's header only when WARDEN_TRUSTED_PROXY_COUNT says a proxy is there.
AXES_FAILURE_LIMIT = WARDEN["LOGIN_FAILURES_LIMIT"]
AXES_COOLOFF_TIME = timedelta(seconds=WARDEN["LOGIN_LOCKOUT_SECONDS"])
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address"]
AXES_RESET_ON_SUCCESS = False  # a login to one's own account does not wipe what a sprayer tried
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_CLIENT_IP_CALLABLE = "tenancy.audit.client_address"
AXES_VERBOSE = False
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"

# WARDEN_LOG_FORMAT=json: one JSON object a line, with the run, task, attempt, operation and request ids
# the line was written under as fields (core/logs.py); plain lines otherwise.
LOG_FORMAT = os.environ.get("WARDEN_LOG_FORMAT", "plain")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "core.logs.ContextFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s%(context)s"},
        "json": {"()": "core.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "plain",
            "filters": ["context"],
        }
    },
    "loggers": {
        "warden": {"handlers": ["console"], "level": os.environ.get("WARDEN_LOG_LEVEL", "INFO")},
        "dramatiq": {"handlers": ["console"], "level": "WARNING"},
    },
}
