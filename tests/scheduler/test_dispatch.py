"""A decision's dispatch on PostgreSQL (app/scheduler/service.py `_dispatch`): one statement
moves the job, claims its GPUs, writes the lease and the status event, and returns the job's
row as it now is, which is what the change is announced with (no second read)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import insert, select

from app.cluster.service import register_node
from app.core.db import utcnow
from app.jobs import lifecycle
from app.jobs.lifecycle import StatusChanged, subscribe
from app.models import GpuLease, Job, JobEvent, User
from app.scheduler.service import schedule_once
from app.wiring import wire

HEARD: list[tuple[str, str, str | None, dict]] = []


def _hear(session, ev: StatusChanged) -> None:
    HEARD.append((ev.job.id, ev.new, ev.job.node, dict(ev.job.params or {})))


def test_a_dispatch_announces_the_job_as_the_statement_left_it(db):
    wire()
    subscribe(_hear)
    try:
        _check(db)
    finally:
        lifecycle._listeners.remove(_hear)


def _check(db) -> None:
    HEARD.clear()
    db.execute(insert(User), [{"id": "usr_disp", "name": "disp", "role": "member"}])
    register_node(db, "d1", [{"index": i} for i in range(4)], hostname="t", cpu_slots=0,
                  info={})
    db.execute(insert(Job), [{"id": "job_disp", "type": "probe", "owner_id": "usr_disp",
                              "status": "queued", "priority": 50, "gpus_requested": 2,
                              "params": {"steps": 3}, "fingerprint": None,
                              "queued_at": utcnow() - timedelta(seconds=5)}])
    db.flush()
    assert schedule_once(db, with_reasons=False) == ["job_disp"]
    assert HEARD == [("job_disp", "dispatched", "d1", {"steps": 3})]
    job = db.get(Job, "job_disp")
    assert (job.status, job.node, job.pending_reason) == ("dispatched", "d1", None)
    assert sorted(db.scalars(select(GpuLease.index).where(GpuLease.job_id == "job_disp"))) \
        == [0, 1]
    assert db.scalar(select(JobEvent.data).where(JobEvent.job_id == "job_disp",
                                                 JobEvent.kind == "status"))["to"] == \
        "dispatched"
    # A job no longer queued is not moved, and nothing is announced for it.
    HEARD.clear()
    db.execute(insert(Job), [{"id": "job_held", "type": "probe", "owner_id": "usr_disp",
                              "status": "queued", "priority": 50, "gpus_requested": 1,
                              "held": True, "queued_at": utcnow()}])
    db.flush()
    assert schedule_once(db, with_reasons=False) == [] and HEARD == []
