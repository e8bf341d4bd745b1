"""HTTP client for the CLI: server URL and token from the environment
(`DRAFTYARD_URL`, `DRAFTYARD_TOKEN`), else `~/.config/draftyard/config.json`, else the embedded
admin token in `$DRAFTYARD_HOME/admin_token`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx

from app.core.config import get_settings

CONFIG = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "draftyard" / "config.json"


class ApiFailure(Exception):
    def __init__(self, status: int, body: dict | str):
        self.status = status
        self.body = body
        err = body.get("error", {}) if isinstance(body, dict) else {}
        super().__init__(f"HTTP {status}: {err.get('message') or body}")


def settings() -> tuple[str, str | None]:
    cfg = {}
    if CONFIG.is_file():
        try:
            cfg = json.loads(CONFIG.read_text())
        except ValueError:
            cfg = {}
    url = os.environ.get("DRAFTYARD_URL") or cfg.get("url") or "http://127.0.0.1:8000"
    token = os.environ.get("DRAFTYARD_TOKEN") or cfg.get("token")
    if not token:
        p = get_settings().home / "admin_token"
        if p.is_file():
            token = p.read_text().strip()
    return url.rstrip("/"), token


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30):
        u, t = settings()
        self.url = url or u
        self.token = token or t
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def _check(self, r: httpx.Response):
        if r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = r.text
            raise ApiFailure(r.status_code, body)
        if r.headers.get("content-type", "").startswith("application/json"):
            return r.json()
        return r.text

    def get(self, path: str, **params):
        return self._check(self.http.get(path, params={k: v for k, v in params.items() if v is not None}))

    def post(self, path: str, body: dict | None = None, **kw):
        return self._check(self.http.post(path, json=body, **kw))

    def delete(self, path: str):
        return self._check(self.http.delete(path))

    def stream_lines(self, path: str, **params):
        with self.http.stream("GET", path, params=params, timeout=None) as r:
            if r.status_code >= 400:
                r.read()
                self._check(r)
            yield from r.iter_text()
