"""Embedded mode (`draftyard up`): SQLite and the filesystem broker, no PostgreSQL or Redis."""

from __future__ import annotations

import os
import stat
import sys

import httpx

from tests.conftest import Proc, free_port, wait_for


def test_embedded_mode_runs_a_probe_without_postgres_or_redis(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("DRAFTYARD_DATABASE_URL", "DRAFTYARD_BROKER_URL")}
    env["DRAFTYARD_HOME"] = str(tmp_path / "home")
    # Point the would-be servers at closed ports: nothing may reach PostgreSQL or Redis.
    env["PGHOST"] = "127.0.0.1"
    env["PGPORT"] = "1"
    port = free_port()
    proc = Proc([sys.executable, "-m", "app.cli.main", "up", "--port", str(port)],
                tmp_path / "up.log", full_env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        def ready():
            try:
                return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False
        wait_for(ready, 90, 0.3, "embedded service ready")
        tok_file = tmp_path / "home" / "admin_token"
        assert stat.S_IMODE(tok_file.stat().st_mode) == 0o600
        c = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {tok_file.read_text().strip()}"})
        job = c.post("/v1/jobs", json={"type": "probe", "params": {"sleep_s": 0.5, "steps": 3}}).json()
        final = wait_for(lambda: (j := c.get(f"/v1/jobs/{job['id']}").json())["status"]
                         in ("succeeded", "failed") and j, 90, 0.3, "probe to finish")
        assert final["status"] == "succeeded", (final, proc.tail())
        assert (tmp_path / "home" / "draftyard.db").exists()
        assert final["metrics_summary"]["python"]
        # The team directory and the run report on SQLite too (issue 16).
        users = c.get("/v1/users").json()["data"]
        assert [u["role"] for u in users] == ["admin"], users
        r = c.get("/v1/runs/run_nope/report")
        assert r.status_code == 404 and r.json()["error"]["param"] == "id", r.text
    finally:
        proc.kill()
