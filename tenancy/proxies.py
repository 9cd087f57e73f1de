"""Reverse proxies Warden was not told about.

Behind a proxy that WARDEN_TRUSTED_PROXY_COUNT does not name, REMOTE_ADDR is the proxy's address for
every client: the audit log records it, the login lockout counts everyone's failures against it, and an
address allowance meant for this machine (loopback) admits whoever the proxy forwards. Warden cannot
learn the real client then, but it can tell that a proxy is there (it adds forwarding headers), refuse
to treat such a request as local, and leave a note for `manage.py doctor` (at most once a minute per
process: one small file under VAR_DIR, never a query)."""

import ipaddress
import json
import logging
import os
import time
from datetime import UTC, datetime

from django.conf import settings

log = logging.getLogger("warden.proxies")

# What proxies add (nginx, Caddy, Traefik, HAProxy, cloud load balancers), as they appear in request.META.
FORWARDING_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP")
SIGHTING_FILE = "proxy-seen.json"
SIGHTING_INTERVAL_SECONDS = 60
_last_noted = [float("-inf")]  # this process's last note (monotonic clock)


def forwarding_headers(meta) -> list[str]:
    """The forwarding headers a request (its META, or a WSGI environ) carries, as HTTP names."""
    names = dict.fromkeys((*FORWARDING_HEADERS, settings.WARDEN["CLIENT_IP_HEADER"]))
    return [name.removeprefix("HTTP_").replace("_", "-").title() for name in names if meta.get(name)]


def via_unnamed_proxy(meta) -> bool:
    """The request came through a proxy (or says so) while WARDEN_TRUSTED_PROXY_COUNT is 0."""
    return not settings.WARDEN["TRUSTED_PROXY_COUNT"] and bool(forwarding_headers(meta))


def is_loopback(address: str | None) -> bool:
    try:
        return ipaddress.ip_address(address or "").is_loopback
    except ValueError:
        return False


def sighting_note(meta) -> None:
    """Note that a request came through an unnamed proxy: the time, the headers' names and the peer's
    address (the proxy's), never the headers' values. Never fails the request."""
    now = time.monotonic()
    if now - _last_noted[0] < SIGHTING_INTERVAL_SECONDS:
        return
    _last_noted[0] = now
    note = {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "headers": forwarding_headers(meta),
        "peer": meta.get("REMOTE_ADDR") or "",
    }
    path = settings.VAR_DIR / SIGHTING_FILE
    try:
        partial = path.with_name(f".{SIGHTING_FILE}.{os.getpid()}")
        partial.write_text(json.dumps(note))
        os.replace(partial, path)  # whole or not at all: the doctor never reads half a note
    except OSError as exc:
        log.warning("could not note a request through an unnamed proxy in %s: %s", path, exc)


def sighting_last() -> dict | None:
    """The last note (``at`` as an aware datetime), or None when there is none or it cannot be read."""
    try:
        note = json.loads((settings.VAR_DIR / SIGHTING_FILE).read_text())
        return {**note, "at": datetime.fromisoformat(note["at"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


class UnnamedProxyMiddleware:
    """Notes requests that came through a proxy WARDEN_TRUSTED_PROXY_COUNT does not name (for the doctor).
    A few dictionary lookups per request; the file is written at most once a minute per process."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if via_unnamed_proxy(request.META):
            sighting_note(request.META)
        return self.get_response(request)
