"""Small HTTP services on 127.0.0.1 for the tests (model servers, a team's services): started on a free
port in a thread, answering JSON."""

import http.server
import json
import threading


def serve(handler_class) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve ``handler_class`` on a free port of 127.0.0.1 until the process ends or ``shutdown()``."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def answer_json(handler: http.server.BaseHTTPRequestHandler, body, code: int = 200) -> None:
    """Answer ``body`` (JSON-encoded unless already bytes); a caller that went away (a worker killed on
    purpose) is not an error of the service."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        handler.send_response(code)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
    except OSError:
        pass
