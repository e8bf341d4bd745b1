"""The two ends of submit -> running on PostgreSQL, each one statement fewer than before:

- a submit places its job inside its own transaction when the scheduler lock is free
  (app/scheduler/nudge.py `place_now`), and leaves it to the nudge after commit when another
  pass holds the lock;
- a worker claims a dispatched job in one statement (app/jobs/service.py `claim`): only the
  node that holds a GPU job's GPUs, any node for a CPU job, once."""

from __future__ import annotations

import time
from datetime import timedelta

from sqlalchemy import insert, select, text

from app.cluster.service import register_node
from app.core.db import get_engine, utcnow
from app.jobs import lifecycle
from app.jobs.lifecycle import StatusChanged, subscribe
from app.jobs.service import claim, transition
from app.jobs.states import JobStatus as S
from app.models import Job, JobEvent, User
from app.scheduler.nudge import NUDGE_ASKED, nudge, place_now
from app.scheduler.service import LOCK_KEY, schedule_once
from app.wiring import wire

HEARD: list[tuple[str, str, str | None]] = []


def _hear(session, ev: StatusChanged) -> None:
    HEARD.append((ev.job.id, ev.new, ev.job.node))


def _setup(db, gpus: int = 2) -> None:
    db.execute(insert(User), [{"id": "usr_cl", "name": "cl", "role": "member"}])
    register_node(db, "n1", [{"index": i} for i in range(4)], hostname="t", cpu_slots=64,
                  info={})
    register_node(db, "n2", [{"index": i} for i in range(4)], hostname="t", cpu_slots=64,
                  info={})
    db.execute(insert(Job), [{"id": "job_cl", "type": "probe", "owner_id": "usr_cl",
                              "status": "queued", "priority": 50, "gpus_requested": gpus,
                              "params": {"steps": 1}, "fingerprint": None,
                              "queued_at": utcnow() - timedelta(seconds=5)}])
    db.flush()


def test_a_gpu_job_is_claimed_once_and_only_on_the_node_holding_its_gpus(db):
    wire()
    _setup(db)
    assert schedule_once(db, with_reasons=False) == ["job_cl"]
    node = db.get(Job, "job_cl").node
    other = "n2" if node == "n1" else "n1"
    now = utcnow()
    subscribe(_hear)
    HEARD.clear()
    try:
        assert claim(db, "job_cl", other, worker="w:1", now=now) is False  # stale delivery
        assert HEARD == []
        assert claim(db, "job_cl", node, worker="w:2", now=now) is True
        assert HEARD == [("job_cl", "running", node)]
        assert claim(db, "job_cl", node, worker="w:3", now=now) is False  # duplicate
    finally:
        lifecycle._listeners.remove(_hear)
    job = db.get(Job, "job_cl")
    assert (job.status, job.node, job.worker, job.started_at, job.heartbeat_at,
            job.preempt_by) == ("running", node, "w:2", now, now, None)
    ev = list(db.scalars(select(JobEvent.data).where(JobEvent.job_id == "job_cl",
                                                     JobEvent.kind == "status")
                         .order_by(JobEvent.id)))
    assert [e["to"] for e in ev] == ["dispatched", "running"]


def test_a_cpu_job_is_claimed_by_any_node_and_not_once_cancelled(db):
    wire()
    _setup(db, gpus=0)
    assert schedule_once(db, with_reasons=False) == ["job_cl"]
    assert claim(db, "job_cl", "some-other-node", worker="w:1", now=utcnow()) is True
    assert db.get(Job, "job_cl").node == "some-other-node"
    db.execute(insert(Job), [{"id": "job_cx", "type": "probe", "owner_id": "usr_cl",
                              "status": "queued", "priority": 50, "gpus_requested": 0,
                              "params": {"steps": 1}, "queued_at": utcnow()}])
    db.flush()
    assert schedule_once(db, with_reasons=False) == ["job_cx"]
    transition(db, db.get(Job, "job_cx"), S.cancelled)
    db.flush()
    assert claim(db, "job_cx", "n1", worker="w:1", now=utcnow()) is False
    assert db.get(Job, "job_cx").status == "cancelled"


def test_a_submit_places_its_job_in_its_own_transaction_when_the_lock_is_free(db):
    wire()
    _setup(db)
    # The lock is the cluster's: another test's API may hold it for a moment (its pass
    # then leaves this one to the nudge, as the next test shows): try again, as a later
    # submit would.
    deadline = time.monotonic() + 10
    while True:
        db.info[NUDGE_ASKED] = True
        db.info["after_commit"] = [nudge]
        place_now(db)
        if nudge not in db.info["after_commit"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    job = db.get(Job, "job_cl")
    assert job.status == "dispatched" and job.node in ("n1", "n2")
    assert nudge not in db.info["after_commit"]  # this pass replaces the nudge
    assert len(db.info["after_commit"]) == 1  # the task's send, after commit
    db.execute(insert(Job), [{"id": "job_c2", "type": "probe", "owner_id": "usr_cl",
                              "status": "queued", "priority": 50, "gpus_requested": 0,
                              "params": {"steps": 1}, "queued_at": utcnow()}])
    db.flush()
    # A later change in the same session still wakes the scheduler (the pass's flag is gone).
    transition(db, db.get(Job, "job_c2"), S.cancelled)
    assert nudge in db.info["after_commit"]


def test_a_submit_leaves_placement_to_the_nudge_while_another_pass_holds_the_lock(db):
    wire()
    _setup(db)
    db.info[NUDGE_ASKED] = True
    db.info["after_commit"] = [nudge]
    with get_engine().connect() as other:
        other.execute(text("SELECT pg_advisory_lock(:k)"), {"k": LOCK_KEY})
        try:
            place_now(db)
        finally:
            other.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
            other.commit()
    assert db.get(Job, "job_cl").status == "queued"
    assert db.info["after_commit"] == [nudge]
