"""The per-user storage quota (DRAFTYARD_USER_STORAGE_QUOTA_BYTES, app/storage/reserve.py):
new work over quota is refused at submit with the numbers; deleting brings the user under."""

from __future__ import annotations

import pytest

from app.core.config import get_settings
from app.core.errors import Conflict
from app.core.ids import new_id
from app.jobs.schemas import JobCreate, JobType
from app.jobs.service import create_job
from app.models import Artifact, Job
from app.storage.reserve import check_quota, user_bytes


def _art(db, user, n: int) -> Artifact:
    a = Artifact(id=new_id("art"), kind="tokenized", uri="/nonexistent", bytes=n, files=[],
                 owner_id=user.id)
    db.add(a)
    db.flush()
    return a


def test_quota_refuses_new_work_with_the_numbers(db, user, monkeypatch):
    monkeypatch.setattr(get_settings(), "user_storage_quota_bytes", 10_000)
    a = _art(db, user, 6_000)
    running = Job(id=new_id("job"), type="extract", owner_id=user.id, status="running",
                  disk_bytes=3_000, disk_volume="scratch")
    db.add(running)
    db.flush()
    assert user_bytes(db, user.id) == 9_000
    create_job(db, user, JobCreate(type=JobType.probe))  # under quota: accepted
    _art(db, user, 1_000)  # now at the quota
    with pytest.raises(Conflict) as e:
        create_job(db, user, JobCreate(type=JobType.probe))
    assert e.value.code == "storage_quota_exceeded"
    assert "10000 bytes" in e.value.message and "uses 9.8 KiB (10000 bytes)" in e.value.message
    assert e.value.details == {"used_bytes": 10_000, "quota_bytes": 10_000}
    a.deleted_at = a.created_at  # a tombstone no longer counts
    db.flush()
    check_quota(db, user.id, user.name, "a plan")


def test_no_quota_by_default(db, user):
    assert get_settings().user_storage_quota_bytes == 0
    _art(db, user, 10**15)
    check_quota(db, user.id, user.name, "a plan")
