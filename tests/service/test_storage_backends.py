"""Storage reads on both backends (tests/conftest.py both_backends): GET /v1/storage, the
prune dry run and `draftyard storage` once a job has failed and another was cancelled, whose
scratch retention keeps for the TTL (app/storage/retention.py). The finished run's numbers
are tests/service/test_storage_usage.py's (PostgreSQL only: a whole run per backend is a
minute and a half)."""

from __future__ import annotations

import pytest

from tests.service.test_cli import cli

pytestmark = pytest.mark.both_backends


class ServerError(AssertionError):
    """A 5xx: what SQLite's naive timestamps once gave here (app/models/base.py UTCDateTime)."""


def _read(r) -> dict:
    if r.status_code >= 500:
        raise ServerError(f"{r.request.method} {r.request.url.path}: {r.status_code} {r.text}")
    assert r.status_code == 200, r.text
    return r.json()


def test_storage_reads_after_a_failed_and_a_cancelled_job(api, worker):
    failed = api.submit(type="probe", params={"fail": True, "steps": 1, "import_torch": False})
    cancelled = api.submit(type="probe", params={"sleep_s": 30, "steps": 30,
                                                 "import_torch": False})
    api.wait_job(cancelled["id"], ("running",), 30)
    assert api.post(f"/v1/jobs/{cancelled['id']}/cancel").status_code == 200
    assert api.wait_job(cancelled["id"])["status"] == "cancelled"
    assert api.wait_job(failed["id"])["status"] == "failed"

    u = _read(api.get("/v1/storage"))
    assert sum(k["bytes"] for k in u["by_kind"]) == u["artifacts"]["bytes"]
    assert sum(o["bytes"] for o in u["by_owner"]) == u["artifacts"]["bytes"]
    assert {v["name"] for v in u["volumes"]} == {"artifacts", "scratch"}
    items = _read(api.post("/v1/storage/prune", {"dry_run": True}))["items"]
    # Within the TTL a failed or cancelled job's scratch stays: a retry resumes from it.
    assert not {failed["id"], cancelled["id"]} & {i["id"] for i in items}
    p = cli(api, "storage")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "volumes" in p.stdout and "by kind" in p.stdout, p.stdout
