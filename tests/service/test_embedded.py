"""Embedded mode (`draftyard up`): SQLite and the filesystem broker, no PostgreSQL or Redis.
The session's embedded deployment (tests/conftest.py `embedded`), the one the both_backends
tests run on too."""

from __future__ import annotations

import os
import stat
import sys
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import httpx
import pytest

from tests.conftest import Proc, free_port, wait_for, wait_ready


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
    # The team directory and the run report on SQLite too.
    users = c.get("/v1/users").json()["data"]
    assert "admin" in [u["role"] for u in users], users
    r = c.get("/v1/runs/run_nope/report")
    assert r.status_code == 404 and r.json()["error"]["param"] == "id", r.text


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.fixture(scope="module")
def own_up(tmp_path_factory):
    """`draftyard up` on a home that exists already, open to everyone (0755, as an earlier
    version or a plain `mkdir` left it), under the usual umask 022."""
    tmp = tmp_path_factory.mktemp("embedded")
    home = tmp / "home"
    home.mkdir()
    (home / "notes.txt").write_text("left here before")
    os.chmod(home, 0o755)
    env = {k: v for k, v in os.environ.items()
           if k not in ("DRAFTYARD_DATABASE_URL", "DRAFTYARD_BROKER_URL")}
    env["DRAFTYARD_HOME"] = str(home)
    env["DRAFTYARD_DATA_ROOTS"] = str(tmp / "data")
    # Point the would-be servers at closed ports: nothing may reach PostgreSQL or Redis.
    env["PGHOST"] = "127.0.0.1"
    env["PGPORT"] = "1"
    port = free_port()
    old = os.umask(0o022)
    try:
        proc = Proc([sys.executable, "-m", "app.cli.main", "up", "--port", str(port)],
                    tmp / "up.log", full_env=env)
    finally:
        os.umask(old)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, 90, "draftyard up")
        token = (home / "admin_token").read_text().strip()
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                          timeout=30) as c:
            yield SimpleNamespace(c=c, home=home, proc=proc)
    finally:
        proc.kill()


def _finished(c: httpx.Client, job_id: str) -> dict:
    return wait_for(lambda: (j := c.get(f"/v1/jobs/{job_id}").json())["status"]
                    in ("succeeded", "failed", "cancelled") and j, 90, 0.3, f"{job_id} to end")


def test_storage_answers_after_failed_and_cancelled_jobs(own_up):
    """A failed or cancelled job's scratch is kept for a retry within the TTL: the storage
    plan compares its finished_at, read back from SQLite, with the clock (a 500 when SQLite
    handed back a naive time)."""
    c = own_up.c
    failed = c.post("/v1/jobs", json={"type": "probe", "params": {
        "fail": True, "import_torch": False}}).json()
    slow = c.post("/v1/jobs", json={"type": "probe", "params": {
        "sleep_s": 60, "import_torch": False}}).json()
    wait_for(lambda: c.get(f"/v1/jobs/{slow['id']}").json()["status"] == "running", 60, 0.3,
             "the slow probe to run")
    assert c.post(f"/v1/jobs/{slow['id']}/cancel").status_code == 200
    assert _finished(c, failed["id"])["status"] == "failed"
    assert _finished(c, slow["id"])["status"] == "cancelled"
    r = c.get("/v1/storage")
    assert r.status_code == 200, (r.text, own_up.proc.tail())
    for t in ("created_at", "started_at", "finished_at"):
        v = c.get(f"/v1/jobs/{failed['id']}").json()[t]
        assert "T" in v and v.endswith("+00:00"), (t, v)


def test_the_home_and_what_is_written_in_it_are_private(own_up):
    """0700 folders and 0600 files: the home (tightened at start, with a warning that names
    it), the database, the token, uploads, artifacts, job folders and their logs."""
    c, home = own_up.c, own_up.home
    assert _mode(home) == 0o700
    log = own_up.proc.tail(400)
    assert str(home) in log and "0700" in log, log
    r = c.post("/v1/datasets", files={"file": ("chat.jsonl", b'{"prompt": "hi"}\n' * 8)},
               data={"name": "private"})
    assert r.status_code == 201, r.text
    assert _finished(c, r.json()["job_id"])["status"] == "succeeded"
    seen = {"uploads": 0, "artifacts": 0, "jobs": 0}
    open_ = []
    for dirpath, dirs, files in os.walk(home):
        top = os.path.relpath(dirpath, home).split(os.sep)[0]
        if top in seen:
            seen[top] += len(files)
        for d in dirs:
            if _mode(os.path.join(dirpath, d)) != 0o700:
                open_.append(os.path.join(dirpath, d))
        for f in files:
            p = os.path.join(dirpath, f)
            if p != str(home / "notes.txt") and stat.S_ISREG(os.lstat(p).st_mode) \
                    and _mode(p) != 0o600:
                open_.append(p)
    assert not open_, [(p, oct(_mode(p))) for p in open_]
    assert all(seen.values()), seen  # an upload, an artifact and a job log were checked
    assert list(home.glob("jobs/*/log.txt")), list(home.glob("jobs/**"))
    assert _mode(home / "draftyard.db") == 0o600


def test_timestamps_read_back_aware_utc_on_sqlite(tmp_path, monkeypatch):
    """Every timestamp column, on the embedded database: aware UTC, the instant written
    (an aware non-UTC value is converted, not stored hours off), and the storage plan can
    compare a failed job's finished_at with the clock."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from app.core.config import get_settings
    from app.core.db import make_engine
    from app.core.migrate import upgrade_head
    from app.models import Job, User
    from app.storage import retention

    url = f"sqlite:///{tmp_path / 'own_up.db'}"
    upgrade_head(url)
    eng = make_engine(url)
    plus2 = datetime(2026, 1, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    now = datetime.now(timezone.utc)
    with Session(eng) as s:
        s.add(User(id="usr_a", name="a", role="member"))
        s.flush()
        s.add(Job(id="job_a", type="probe", owner_id="usr_a", status="failed",
                  started_at=plus2, finished_at=now, heartbeat_at=now.replace(tzinfo=None)))
        s.commit()
    with Session(eng) as s:
        job = s.get(Job, "job_a")
        assert job is not None
        stamps = {c.name: getattr(job, c.name) for c in Job.__table__.columns
                  if isinstance(getattr(job, c.name), datetime)}
        assert set(stamps) >= {"created_at", "started_at", "finished_at", "heartbeat_at"}
        for name, v in stamps.items():
            assert v.utcoffset() == timedelta(0), (name, v)
        assert job.started_at == plus2 and job.finished_at == now
        assert s.scalar(select(Job.finished_at)).tzinfo is not None
        monkeypatch.setattr(get_settings(), "home", tmp_path)
        (tmp_path / "jobs" / "job_a").mkdir(parents=True)
        assert retention.plan(s) == []  # within the scratch TTL: kept, and no TypeError
    eng.dispose()


def test_every_timestamp_column_has_the_one_type():
    from sqlalchemy import DateTime

    from app.models import Base
    from app.models.base import UTCDateTime

    stamps = [c for t in Base.metadata.tables.values() for c in t.columns
              if isinstance(c.type, DateTime | UTCDateTime)]
    assert len(stamps) > 20 and all(isinstance(c.type, UTCDateTime) for c in stamps), \
        [f"{c.table.name}.{c.name}" for c in stamps if not isinstance(c.type, UTCDateTime)]
