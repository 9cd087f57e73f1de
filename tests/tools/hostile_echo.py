"""A hostile service for the secret tests: real HTTP on 127.0.0.1 that answers every request with the
credentials it received, in every shape that slips past a naive scrubber.

- ``GET|POST /echo``: 200, a JSON object holding each credential header's value as a dict key, in
  base64 (standard and URL-safe, padded and not, and inside a longer base64 text at each of the three
  byte alignments), percent-encoded (``quote`` and ``quote_plus``) and in hex (lower and upper case);
- ``/refuse``: 400, a text body whose first credential straddles the 200th character (where Warden cuts
  a refusal's body);
- anything else: 404.

Every request is kept in ``requests`` (method, path, headers), so a test can tell what reached it. The
credential headers are ``Authorization`` and every ``X-…`` header.
"""

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, quote_plus

CUT = 200  # where Warden cuts an HTTP refusal's body (tools/http_tools.py, REFUSAL_TEXT)
PREFIXES = (b"", b"a", b"ab")  # before the secret inside a longer base64 text: the three byte alignments


def inside(value: bytes, prefix: bytes, *, urlsafe: bool = False) -> str:
    """The secret as it sits in a longer base64 text (a log line, a token), after ``prefix``."""
    encode = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    return encode(b'{"log": "' + prefix + value + b'", "more": "of the record"}').decode()


def echoed(value: str) -> dict:
    """Every shape the service echoes one credential in (each value a text holding the secret)."""
    raw = value.encode()
    shapes = {
        "base64": base64.b64encode(raw).decode(),
        "base64_unpadded": base64.b64encode(raw).decode().rstrip("="),
        "base64url": base64.urlsafe_b64encode(raw).decode(),
        "base64url_unpadded": base64.urlsafe_b64encode(raw).decode().rstrip("="),
        "quoted": quote(value, safe=""),
        "quoted_path": quote(value),
        "quoted_plus": quote_plus(value),
        "hex": raw.hex(),
        "HEX": raw.hex().upper(),
        "as_a_sentence": f"the request carried {value} as its credential",
    }
    for prefix in PREFIXES:
        shapes[f"inside_base64_{len(prefix)}"] = inside(raw, prefix)
        shapes[f"inside_base64url_{len(prefix)}"] = inside(raw, prefix, urlsafe=True)
    return shapes


def straddling(value: str, *, before: int = 0) -> str:
    """A refusal's body whose ``value`` straddles the CUT-th character (counting ``before`` characters that
    the text will be prefixed with, as an MCP SDK prefixes a tool's error)."""
    return "refused: " + "." * (CUT - before - 9 - len(value) // 2) + value + " was not accepted"


class HostileEcho:
    def __init__(self):
        self.requests: list[dict] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "HostileEcho":
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, name="hostile echo", daemon=True
        ).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def received(self) -> list[str]:
        """Every header value that reached the service."""
        return [value for request in self.requests for value in request["headers"].values()]


def credentials(headers: dict) -> dict:
    return {k: v for k, v in headers.items() if k.lower() == "authorization" or k.lower().startswith("x-")}


def _handler(service: HostileEcho):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code: int, body: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _serve(self) -> None:
            headers = dict(self.headers.items())
            service.requests.append({"method": self.command, "path": self.path, "headers": headers})
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            secrets = credentials(headers)
            path = self.path.split("?")[0]
            if path == "/echo":
                body = {"headers": {value: name for name, value in secrets.items()}}  # values as keys
                body |= {f"{name}.{shape}": text for name, value in secrets.items()
                         for shape, text in echoed(value).items()}  # fmt: skip
                body["keys"] = {text: shape for value in secrets.values() for shape, text in echoed(value).items()}
                self._send(200, json.dumps(body).encode(), "application/json")
            elif path == "/refuse" and secrets:
                self._send(400, straddling(next(iter(secrets.values()))).encode(), "text/plain")
            else:
                self._send(404, b'{"error": "no such thing"}', "application/json")

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

    return Handler


def traces(value: str) -> list[str]:
    """What of ``value`` must be found nowhere once Warden has recorded an echo: the value, each half of
    it (what a cut across it would leave), each whole shape, and of a shape inside a longer base64 text
    the characters that depend on the secret's bytes alone."""
    raw = value.encode()
    found = [value, value[: len(value) // 2], value[len(value) // 2 :]]
    for shape, text in echoed(value).items():
        if shape.startswith("inside_"):
            before = len(b'{"log": "' + PREFIXES[int(shape[-1])])
            found.append(text[-(-8 * before // 6) : 8 * (before + len(raw)) // 6])
        elif shape != "as_a_sentence":
            found.append(text)
    return found
