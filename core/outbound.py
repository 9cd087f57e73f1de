"""Outbound HTTP to URLs people configure (webhook endpoints, the approval notification webhook).

Such a URL could point Warden at itself, at a private network or at a cloud's metadata service (SSRF).
It is refused when it is registered and again at every send, on the addresses its name resolves to at
that moment; the request then connects to the address that was checked, so a name that resolves
elsewhere a moment later (DNS rebinding) changes nothing, and redirects are not followed.
``WARDEN_WEBHOOK_ALLOW_PRIVATE=1`` lifts the rule (tests, a receiver on the same machine).
"""

import http.client
import ipaddress
import socket
import ssl
from datetime import UTC, datetime
from urllib.parse import urlsplit

from django.conf import settings
from standardwebhooks import Webhook

# Beyond what ipaddress calls private, loopback, link-local, multicast, reserved or unspecified.
_ALSO_BLOCKED = [ipaddress.ip_network(n) for n in ("100.64.0.0/10", "192.0.0.0/24", "198.18.0.0/15")]


class OutboundRefused(ValueError):
    """The URL leads somewhere Warden does not send to."""


def _blocked(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    special = ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast
    return special or ip.is_reserved or ip.is_unspecified or any(ip in net for net in _ALSO_BLOCKED)


def _parts(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url or "")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OutboundRefused("the URL must be http:// or https:// with a host")
    if parts.username or parts.password:
        raise OutboundRefused("the URL must not carry a user name or password")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise OutboundRefused(f"the URL's port is invalid: {exc}") from exc
    return parts.scheme, parts.hostname, port


def _resolve(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise OutboundRefused(f"{host} does not resolve: {exc}") from exc
    return list(dict.fromkeys(info[4][0] for info in infos))


def _checked(host: str, port: int) -> list[str]:
    addresses = _resolve(host, port)
    if settings.WARDEN["WEBHOOK_ALLOW_PRIVATE"]:
        return addresses
    blocked = [a for a in addresses if _blocked(a)]
    if blocked or host.rstrip(".").lower() == "localhost":
        where = ", ".join(blocked) or "localhost"
        raise OutboundRefused(
            f"{host} leads to a loopback, private, link-local or metadata address ({where}); "
            "set WARDEN_WEBHOOK_ALLOW_PRIVATE=1 to allow it"
        )
    return addresses


def url_refusal(url: str) -> str:
    """Why this URL may not be registered ('' when it may). A name that does not resolve yet is
    accepted: it is checked again at every send."""
    try:
        _, host, port = _parts(url)
        _checked(host, port)
    except OutboundRefused as exc:
        if "does not resolve" in str(exc):
            return ""
        return str(exc)
    return ""


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, host, port, *, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self):
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, host, port, *, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._address = address

    def connect(self):
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def post(url: str, body: bytes, headers: dict, *, timeout: float) -> int:
    """POST ``body`` to ``url`` (the address checked just now) and return the status code. Raises
    OutboundRefused for a URL that leads where Warden does not send, OSError when it cannot connect."""
    scheme, host, port = _parts(url)
    address = _checked(host, port)[0]
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection = (_PinnedHTTPS if scheme == "https" else _PinnedHTTP)(host, port, address=address, timeout=timeout)
    try:
        connection.request("POST", path, body=body, headers={"Content-Length": str(len(body)), **headers})
        response = connection.getresponse()
        response.read(65536)
        return response.status
    finally:
        connection.close()


def standard_webhook_headers(secret: str, message_id: str, body: bytes, *, now: datetime | None = None) -> dict:
    """The Standard Webhooks headers (https://www.standardwebhooks.com): ``webhook-id`` (the same for every
    retry of one message), ``webhook-timestamp`` and ``webhook-signature`` (``v1,<base64 HMAC-SHA256 of
    "<id>.<timestamp>.<body>">``), keyed by the secret's UTF-8 bytes. A receiver verifies with the spec's
    library: ``Webhook(secret.encode()).verify(body, headers)`` (docs/api.md)."""
    now = now or datetime.now(tz=UTC)
    signature = Webhook(secret.encode()).sign(msg_id=message_id, timestamp=now, data=body.decode())
    return {"webhook-id": message_id, "webhook-timestamp": str(int(now.timestamp())), "webhook-signature": signature}
