"""Embedded mode (`draftyard up`): SQLite and the filesystem broker, no PostgreSQL or Redis.
The session's embedded deployment (tests/conftest.py `embedded`), the one the both_backends
tests run on too."""

from __future__ import annotations

import stat

import httpx

from tests.conftest import wait_for


def test_embedded_mode_runs_a_probe_without_postgres_or_redis(embedded):
    # Its environment names neither server, and libpq points at a closed port
    # (tests/service/stack.py Embedded): nothing may reach PostgreSQL or Redis.
    assert "DRAFTYARD_DATABASE_URL" not in embedded.env and embedded.env["PGPORT"] == "1"
    tok_file = embedded.home / "admin_token"
    assert stat.S_IMODE(tok_file.stat().st_mode) == 0o600
    c = httpx.Client(base_url=embedded.url,
                     headers={"Authorization": f"Bearer {tok_file.read_text().strip()}"})
    job = c.post("/v1/jobs", json={"type": "probe", "params": {"sleep_s": 0.5, "steps": 3}}).json()
    final = wait_for(lambda: (j := c.get(f"/v1/jobs/{job['id']}").json())["status"]
                     in ("succeeded", "failed") and j, 90, 0.3, "probe to finish")
    assert final["status"] == "succeeded", (final, embedded.proc.tail() if embedded.proc else "")
    assert final["node"] == embedded.node
    assert (embedded.home / "draftyard.db").exists()
    assert final["metrics_summary"]["python"]
    # The team directory and the run report on SQLite too (issue 16).
    users = c.get("/v1/users").json()["data"]
    assert "admin" in [u["role"] for u in users], users
    r = c.get("/v1/runs/run_nope/report")
    assert r.status_code == 404 and r.json()["error"]["param"] == "id", r.text
