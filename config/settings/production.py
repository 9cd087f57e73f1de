"""Production settings: base, served over HTTPS only. `manage.py check --deploy --fail-level WARNING` is clean
(tests/security/test_deploy_settings.py).

Everything site-specific comes from the environment: DJANGO_SECRET_KEY (required), DJANGO_ALLOWED_HOSTS,
DJANGO_CSRF_TRUSTED_ORIGINS, and DATABASE_URL / REDIS_URL for scaled mode, read by base exactly as in
development. Behind a proxy that terminates TLS, set DJANGO_SECURE_PROXY_SSL_HEADER=1 (docs/operations.md).
"""

import os

from django.core.exceptions import ImproperlyConfigured

# Checked before base is read: base would otherwise generate a key into var/, and each host of a scaled
# deployment would sign sessions with its own. A weak key is left to `check --deploy` (security.W009).
if not os.environ.get("DJANGO_SECRET_KEY", "").strip():
    raise ImproperlyConfigured(
        "DJANGO_SECRET_KEY is not set: production needs a random key of 50 or more characters, e.g. from "
        "python -c 'import secrets; print(secrets.token_urlsafe(50))'"
    )

from .base import *  # noqa: E402,F401,F403
from .base import ALLOWED_HOSTS, WARDEN  # noqa: E402


def _env_flag(name: str, default: bool) -> bool:
    return os.environ.get(name, "1" if default else "0") == "1"


DEBUG = False
WARDEN["PRODUCTION"] = True  # drill faults and sandbox tools must stay off (runs/checks.py, manage.py doctor)
ALLOWED_HOSTS = [host.strip() for host in ALLOWED_HOSTS if host.strip()]
# Origins (scheme and host) whose form posts are accepted besides the site's own, e.g. when the proxy
# presents the site under another name: "https://warden.example.com,https://ops.example.com".
CSRF_TRUSTED_ORIGINS = [o.strip() for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()]

# HTTPS only: plain HTTP is redirected, cookies never leave over it, and browsers remember for a year.
SECURE_SSL_REDIRECT = _env_flag("DJANGO_SECURE_SSL_REDIRECT", True)
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
CSRF_COOKIE_HTTPONLY = True  # pages carry the token in their forms and htmx headers; no script reads the cookie
SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_SECURE_HSTS_SECONDS", 31536000))
SECURE_HSTS_INCLUDE_SUBDOMAINS = _env_flag("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = _env_flag("DJANGO_SECURE_HSTS_PRELOAD", True)
# A proxy that terminates TLS talks plain HTTP to us; the request is taken as HTTPS when it says so. Only
# behind a proxy that sets X-Forwarded-Proto itself, replacing what the client sent: otherwise a client
# could claim HTTPS over plain HTTP.
if _env_flag("DJANGO_SECURE_PROXY_SSL_HEADER", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Django's defaults, stated: they are part of what this module promises.
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# CONTENT_SECURITY_POLICY (with frame-ancestors 'none') and its middleware come from base unchanged.

# The sandbox systems' effects listing shows every project's effects to any token with the read scope: a
# drill and demo aid, off in production unless asked for.
WARDEN["SANDBOX_TOOLS"] = os.environ.get("WARDEN_SANDBOX_TOOLS", "0") == "1"
# Drill faults (a run's input can ask a worker to crash, a tool to time out): for rehearsals, not here.
WARDEN["DRILL_FAULTS"] = os.environ.get("WARDEN_DRILL_FAULTS", "0") == "1"
