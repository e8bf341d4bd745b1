"""A real HTTP receiver for webhook tests: records every request and answers 500 to the first
`fail_first` of them (else `code`, with `body` and `headers`). It listens on 127.0.0.2, the
address the tests' DRAFTYARD_WEBHOOK_ALLOWED_HOSTS allows (tests/conftest.py): webhooks reach
no internal address an admin did not allow."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self, fail_first: int = 0, host: str = "127.0.0.2", code: int = 200,
                 body: bytes = b"", headers: dict[str, str] | None = None):
        self.fail_first = fail_first
        self.requests: list[dict] = []  # {"headers", "body", "answered"}
        self._lock = threading.Lock()
        outer, reply = self, body

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with outer._lock:
                    answer = 500 if len(outer.requests) < outer.fail_first else code
                    outer.requests.append({"headers": dict(self.headers), "body": body,
                                           "answered": answer})
                self.send_response(answer)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *a):  # quiet
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://{host}:{self.port}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Receiver":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self.requests)
