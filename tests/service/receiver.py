"""A real HTTP receiver on 127.0.0.1 for webhook tests: records every request and answers
500 to the first `fail_first` of them."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self, fail_first: int = 0):
        self.fail_first = fail_first
        self.requests: list[dict] = []  # {"headers", "body", "answered"}
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with outer._lock:
                    code = 500 if len(outer.requests) < outer.fail_first else 200
                    outer.requests.append({"headers": dict(self.headers), "body": body,
                                           "answered": code})
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
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
