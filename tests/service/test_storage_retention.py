"""Retention rules (app/storage/retention.py) on the real database, in-process (rolled back):
when an offline run's hidden states go, what `keep` keeps, and which scratch a prune may
remove: never a live (retried, requeued) job's, nor a failed one's within the TTL."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.core.db import utcnow
from app.core.ids import new_id
from app.jobs.service import transition
from app.jobs.states import S
from app.models import Artifact, Job, Run
from app.storage import retention


def _job(db, user, stage: str, status: str, run: Run | None = None, **kw) -> Job:
    j = Job(id=new_id("job"), type=stage, owner_id=user.id, status=status,
            run_id=run.id if run else None, run_stage=stage if run else None, **kw)
    db.add(j)
    db.flush()
    return j


def _offline_run(db, user, *, keep=None, train="running"):
    run = Run(id=new_id("run"), name="r", owner_id=user.id, spec={}, status="running")
    db.add(run)
    db.flush()
    ext = _job(db, user, "extract", "succeeded", run, keep=keep)
    hs = Artifact(id=new_id("art"), kind="hidden_states", uri="/nonexistent/hs", bytes=4096,
                  files=[], producer_job=ext.id, owner_id=user.id)
    db.add(hs)
    ext.outputs = [hs.id]
    tr = _job(db, user, "train", train, run, inputs={"hidden_states": {"job": ext.id}})
    db.flush()
    return run, ext, hs, tr


def test_hidden_states_go_when_train_succeeds(db, user):
    run, ext, hs, tr = _offline_run(db, user)
    assert [i.id for i in retention.plan(db) if i.id == hs.id] == []  # train still needs them
    ev = _job(db, user, "evaluate", "queued", run)  # evaluate reads no hidden states
    transition(db, tr, S.succeeded)  # the subscriber (app/wiring.py) sees the end
    assert hs.deleted_at is not None and hs.deleted_by == "retention"
    assert hs.bytes_freed == 4096
    assert ev.status == "queued"


def test_keep_and_the_server_default_keep_them(db, user, monkeypatch):
    _, _, kept, tr = _offline_run(db, user, keep=True)
    transition(db, tr, S.succeeded)
    assert kept.deleted_at is None
    from app.core.config import get_settings

    monkeypatch.setattr(get_settings(), "keep_hidden_states", True)
    _, _, by_default, tr2 = _offline_run(db, user)
    transition(db, tr2, S.succeeded)
    assert by_default.deleted_at is None
    _, _, overridden, tr3 = _offline_run(db, user, keep=False)
    transition(db, tr3, S.succeeded)
    assert overridden.deleted_at is not None  # the job's keep wins over the default


def test_hidden_states_another_live_job_needs_stay(db, user):
    run, ext, hs, tr = _offline_run(db, user)
    other = _job(db, user, "train", "queued", inputs={"hidden_states": hs.id})
    transition(db, tr, S.succeeded)
    assert hs.deleted_at is None
    transition(db, other, S.cancelled)  # it ended: nothing needs them, but not this run's job
    assert hs.id in [i.id for i in retention.plan(db)]


@pytest.fixture
def work(monkeypatch, tmp_path):
    """Jobs' folders under a private jobs dir, so the plan sees only this test's scratch."""
    from app.core.config import get_settings

    monkeypatch.setattr(type(get_settings()), "jobs_dir", property(lambda _: tmp_path))

    def make(job: Job, n: int = 3) -> None:
        d = tmp_path / job.id / "work" / "hidden_states"
        d.mkdir(parents=True)
        for i in range(n):
            (d / f"hs_{i}.safetensors").write_bytes(b"x" * 100)
    return make


def test_scratch_outlives_a_failed_attempt_until_the_ttl(db, user, work):
    now = utcnow()
    fresh = _job(db, user, "extract", "failed", finished_at=now - timedelta(hours=1),
                 scratch_bytes=300)
    old = _job(db, user, "extract", "failed", finished_at=now - timedelta(days=4),
               scratch_bytes=300)
    # Failed long ago but retried since: live again, its shards are what the retry resumes.
    retried = _job(db, user, "extract", "queued", finished_at=now - timedelta(days=4))
    preempted = _job(db, user, "train", "running", finished_at=None)
    kept = _job(db, user, "extract", "cancelled", finished_at=now - timedelta(days=9), keep=True)
    done = _job(db, user, "prepare", "succeeded", finished_at=now, scratch_bytes=None)
    for j in (fresh, old, retried, preempted, kept, done):
        work(j)
    ids = {i.id: i for i in retention.plan(db) if i.what == "scratch"}
    assert set(ids) == {old.id, done.id}
    assert ids[old.id].bytes == 300 and "past the scratch TTL" in ids[old.id].reason
    assert retention.prune(db, [ids[old.id]]) == 300
    assert old.scratch_removed_at is not None
    assert old.id not in {i.id for i in retention.plan(db)}  # removed once
