"""A small payments service for the refunds example and the HTTP tool tests: real HTTP on 127.0.0.1,
an API key it checks, refunds deduplicated by the Idempotency-Key header, a lookup by key and a void.

    python -m examples.refunds.payments_service --port 8701 --api-key demo-payments-key

Every effect (a refund made, a refund voided) is kept in ``effects`` and, with --effects FILE, appended
to that file as a JSON line, so a test or a person can count what reached the service. Reasons that
drill the service's bad days: "slow" answers after 3 s (the refund is made at once), "lost" makes the
refund and answers 502 (the answer is lost), "echo" puts the request's credential in its answer and
"quote" in a refusal (a careless service: Warden must not show it)."""

import argparse
import json
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

CHARGES = {"ch_1001": 12_500, "ch_1002": 4_000, "ch_1003": 99_900}
SLOW_SECONDS = 3.0


class PaymentsService:
    def __init__(self, *, api_key: str, port: int = 0, effects_file: str = ""):
        self.api_key, self.effects_file = api_key, effects_file
        self.effects: list[dict] = []
        self.requests: list[dict] = []  # every request: method, path, idempotency key
        self.refunds: dict[str, dict] = {}  # by refund id
        self.by_key: dict[str, str] = {}
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> "PaymentsService":
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, name="payments", daemon=True
        ).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def effect(self, kind: str, refund: dict) -> None:
        record = {"effect": kind, **refund}
        self.effects.append(record)
        if self.effects_file:
            with open(self.effects_file, "a") as out:
                out.write(json.dumps(record) + "\n")

    def refund(self, charge_id: str, body: dict, key: str) -> tuple[int, dict]:
        amount = body.get("amount_cents")
        if charge_id not in CHARGES:
            return 404, {"error": f"no charge {charge_id}"}
        if not isinstance(amount, int) or not 0 < amount <= CHARGES[charge_id]:
            return 422, {"error": "amount_cents must be a positive integer, at most the charge"}
        with self.lock:
            if key and key in self.by_key:  # the same key: the same refund, not a second one
                return 200, self.refunds[self.by_key[key]]
            refund = {
                "refund_id": f"re_{uuid.uuid4().hex[:10]}",
                "charge_id": charge_id,
                "amount_cents": amount,
                "reason": str(body.get("reason", ""))[:200],
                "status": "succeeded",
            }
            self.refunds[refund["refund_id"]] = refund
            if key:
                self.by_key[key] = refund["refund_id"]
            self.effect("refund", {**refund, "key": key})
        return 201, refund

    def void(self, refund_id: str) -> tuple[int, dict]:
        with self.lock:
            refund = self.refunds.get(refund_id)
            if refund is None:
                return 404, {"error": f"no refund {refund_id}"}
            if refund["status"] != "voided":
                refund["status"] = "voided"
                self.effect("void", {"refund_id": refund_id})
        return 200, refund


def _handler(service: PaymentsService):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet: a test's output is its own
            pass

        def _answer(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self, method: str) -> tuple[int, dict]:
            key = self.headers.get("Idempotency-Key", "")
            service.requests.append({"method": method, "path": self.path, "key": key})
            if self.headers.get("Authorization") != f"Bearer {service.api_key}":
                return 401, {"error": "a valid API key is required"}
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}") if length else {}
            except ValueError:
                return 400, {"error": "the body is not JSON"}
            path = unquote(self.path.split("?")[0])
            if method == "GET" and (m := re.fullmatch(r"/v1/charges/([^/]+)", path)):
                charge = m.group(1)
                if charge not in CHARGES:
                    return 404, {"error": f"no charge {charge}"}
                refunded = sum(r["amount_cents"] for r in service.refunds.values()
                               if r["charge_id"] == charge and r["status"] == "succeeded")  # fmt: skip
                return 200, {"charge_id": charge, "amount_cents": CHARGES[charge], "refunded_cents": refunded}
            if method == "GET" and (m := re.fullmatch(r"/v1/refunds/by-key/([^/]+)", path)):
                refund_id = service.by_key.get(m.group(1))
                return (200, service.refunds[refund_id]) if refund_id else (404, {"error": "no refund with that key"})
            if method == "POST" and (m := re.fullmatch(r"/v1/charges/([^/]+)/refunds", path)):
                code, answer = service.refund(m.group(1), body, key)
                reason = body.get("reason")
                if reason == "slow":
                    time.sleep(SLOW_SECONDS)
                if reason == "lost" and code == 201:
                    return 502, {"error": "bad gateway"}
                if reason == "quote" and code == 201:  # a careless error message quoting the request
                    return 422, {"error": f"refused: the request carried {self.headers.get('Authorization')}"}
                if reason == "echo":
                    answer = {**answer, "debug": {"authorization": self.headers.get("Authorization")}}
                return code, answer
            if method == "POST" and (m := re.fullmatch(r"/v1/refunds/([^/]+)/void", path)):
                return service.void(m.group(1))
            return 404, {"error": f"no route {method} {path}"}

        def do_GET(self):
            self._answer(*self._route("GET"))

        def do_POST(self):
            self._answer(*self._route("POST"))

    return Handler


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8701)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--effects", default="")
    options = parser.parse_args()
    service = PaymentsService(api_key=options.api_key, port=options.port, effects_file=options.effects).start()
    print(f"payments service on {service.url}", flush=True)
    threading.Event().wait()
