"""Job lifecycle in-process, on the rolled-back DB fixture: every status change is announced by
`transition()` and its subscribers (app/wiring.py) follow it, whatever the call site."""

from __future__ import annotations

import os
import uuid

import pytest

from app.core.ids import new_id
from app.datasets.service import get_dataset
from app.jobs import lifecycle
from app.jobs.schemas import JobCreate
from app.jobs.service import cancel_job, create_job, get_job, retry_job, transition
from app.jobs.states import S
from app.models import Dataset, Run, Target
from app.runs.service import get_run, overall_status
from contracts.jobtypes import JobType


def _ingesting(db, user) -> Dataset:
    ds = Dataset(id=new_id("ds"), name="d", owner_id=user.id, status="ingesting", source={})
    src = os.path.join(os.environ["DRAFTYARD_DATA_ROOTS"], "d.jsonl")  # inside the data roots
    with open(src, "w") as fh:
        fh.write('{"messages": [{"role": "user", "content": "hi"}]}\n')
    db.add(ds)
    db.flush()
    job = create_job(db, user, JobCreate(type=JobType.ingest, name="ingest d",
                                         inputs={"source": {"path": src, "name": "d"}},
                                         params={"format": "auto"}))
    ds.job_id = job.id
    db.flush()
    return ds


def test_cancelling_a_queued_ingest_fails_its_dataset_and_retry_reopens_it(db, user):
    ds = _ingesting(db, user)
    job = get_job(db, ds.job_id)
    assert job.status == "queued"
    cancel_job(db, user, job)
    db.flush()
    d = get_dataset(db, ds.id)
    assert d.status == "failed" and d.error["code"] == "cancelled"
    retry_job(db, user, job)
    assert get_dataset(db, ds.id).status == "ingesting"


def test_cancelling_a_runs_stage_job_moves_the_run(db, user):
    """A stage cancelled through POST /v1/jobs/{id}/cancel (not the run's cancel)."""
    tgt = Target(id=new_id("tgt"), name="t", owner_id=user.id, path="/m", tokenizer_path="/m")
    db.add(tgt)
    run = Run(id=new_id("run"), name="r", owner_id=user.id, spec={}, status="pending")
    db.add(run)
    db.flush()
    first = create_job(db, user, JobCreate(type=JobType.probe, name="r: a"), run_id=run.id,
                       run_stage="prepare")
    cancel_job(db, user, first)
    db.flush()
    r = get_run(db, run.id)
    assert r.status == "cancelled" and r.finished_at is not None


def test_a_status_change_in_an_unwired_process_is_refused(db, user, monkeypatch):
    """Hooks that silently do not run were the bug: a process that forgot app.wiring.wire()
    must fail loudly instead."""
    monkeypatch.setattr(lifecycle, "_listeners", [])
    with pytest.raises(RuntimeError, match="not wired"):
        create_job(db, user, JobCreate(type=JobType.probe, name="x"))


# ---- a run's overall status, as its stage jobs move (in-process, every change announced) --

@pytest.mark.parametrize("statuses, overall", [
    ([], "pending"),
    (["pending", "pending"], "pending"),
    (["queued", "pending"], "queued"),
    (["running", "pending"], "running"),
    (["dispatched", "pending"], "running"),
    (["succeeded", "queued"], "running"),      # between stages: the run is under way
    (["succeeded", "pending"], "running"),
    (["succeeded", "succeeded"], "succeeded"),
    (["failed", "pending"], "failed"),
    (["succeeded", "cancelled"], "cancelled"),
    (["failed", "cancelled"], "failed"),       # the failure is the news
    (["cancelling", "cancelled"], "running"),  # still stopping
    (["failed", "running"], "running"),        # another stage still runs
])
def test_overall_status_table(statuses, overall):
    assert overall_status(statuses) == overall


def test_run_status_follows_every_transition_of_its_stages(db, user):
    """Walk a two-stage run through start, failure, retry and success with `transition()`
    only; after each step the run's status is what `overall_status` says of its jobs, and a
    finished run has finished_at (cleared again when a retry reopens it)."""
    run = Run(id=new_id("run"), name="r", owner_id=user.id, spec={}, status="pending")
    db.add(run)
    db.flush()
    a = create_job(db, user, JobCreate(type=JobType.probe, name="r: a"), run_id=run.id,
                   run_stage="prepare")
    b = create_job(db, user, JobCreate(type=JobType.probe, name="r: b"), run_id=run.id,
                   run_stage="train")

    def step(job, new, want):
        transition(db, job, S(new))
        db.flush()
        r = get_run(db, run.id)
        assert r.status == want, (job.run_stage, new, r.status)
        assert (r.finished_at is not None) == (want in ("succeeded", "failed", "cancelled"))

    assert {a.status, b.status} == {"queued"}
    step(a, "dispatched", "running")
    step(a, "running", "running")
    step(a, "failed", "failed")
    step(a, "queued", "queued")        # retry reopens the run
    step(a, "dispatched", "running")
    step(a, "running", "running")
    step(a, "succeeded", "running")    # b still to do
    step(b, "dispatched", "running")
    step(b, "running", "running")
    step(b, "succeeded", "succeeded")


# ---- dispatch is announced; leaving an active state frees the GPUs ------------------------

def _node_with_gpus(db, n: int) -> str:
    from app.models import Gpu, Node

    name = f"n-{uuid.uuid4().hex[:8]}"
    db.add(Node(name=name, cpu_slots=0))
    db.flush()
    db.add_all([Gpu(node=name, index=i) for i in range(n)])
    db.flush()
    return name


def test_a_scheduling_pass_announces_dispatch_and_the_run_follows(db, user, monkeypatch):
    """queued -> dispatched is a status change like the others: the run of a dispatched stage
    is `running` as soon as the pass commits, not only once a worker claims the job."""
    from app.scheduler.service import schedule_once

    heard: list[tuple[str | None, str]] = []
    monkeypatch.setattr(lifecycle, "_listeners",
                        [*lifecycle._listeners, lambda s, ev: heard.append((ev.old, ev.new))])
    node = _node_with_gpus(db, 8)
    run = Run(id=new_id("run"), name="r", owner_id=user.id, spec={}, status="pending")
    db.add(run)
    db.flush()
    job = create_job(db, user, JobCreate(type=JobType.probe, name="r: a", gpus=8),
                     run_id=run.id, run_stage="train")
    assert get_run(db, run.id).status == "queued"
    assert job.id in schedule_once(db)
    db.flush()
    assert get_job(db, job.id).status == "dispatched" and job.node == node
    assert ("queued", "dispatched") in heard
    assert get_run(db, run.id).status == "running"


@pytest.mark.parametrize("path", ["running->failed", "running->queued", "dispatched->cancel"])
def test_leaving_an_active_state_frees_the_gpus_whoever_moves_the_job(db, user, path):
    """transition() alone frees them: the call site (runner, reaper, cancel, undispatch) no
    longer has to remember to."""
    from sqlalchemy import select

    from app.models import Gpu, GpuLease
    from app.scheduler.service import schedule_once

    _node_with_gpus(db, 8)
    job = create_job(db, user, JobCreate(type=JobType.probe, name="a", gpus=8))
    assert job.id in schedule_once(db)
    db.flush()
    held = lambda: db.scalars(select(Gpu).where(Gpu.job_id == job.id)).all()  # noqa: E731
    assert len(held()) == 8
    if path == "dispatched->cancel":
        cancel_job(db, user, job)
    else:
        transition(db, job, S.running)
        assert len(held()) == 8  # still active: kept
        transition(db, job, S(path.split(">")[1]))
    db.flush()
    assert held() == []
    assert all(lease.end_at is not None for lease in
               db.scalars(select(GpuLease).where(GpuLease.job_id == job.id)))


def test_a_submit_without_inputs_is_one_insert_already_queued(db, user):
    """A job with nothing to wait for is written once, already queued, its status events in
    one statement (no INSERT then UPDATE per submit), and reads as before: created, then
    queued, with its events in that order and the 'from nothing' event at its creation."""
    from sqlalchemy import event, select

    from app.models import JobEvent

    seen: list[str] = []

    def log(_conn, _cur, statement, *_):
        seen.append(" ".join(statement.split()[:3]))
    conn = db.connection()
    event.listen(conn, "before_cursor_execute", log)
    try:
        job = create_job(db, user, JobCreate(type=JobType.probe, name="once"))
        db.flush()
    finally:
        event.remove(conn, "before_cursor_execute", log)
    writes = [s for s in seen if s.split()[0] in ("INSERT", "UPDATE")]
    assert writes == ["INSERT INTO jobs", "INSERT INTO job_events"], seen
    assert job.status == "queued" and job.created_at <= job.queued_at
    evs = db.execute(select(JobEvent.data, JobEvent.at).where(JobEvent.job_id == job.id)
                     .order_by(JobEvent.id)).all()
    assert [e.data["to"] for e in evs] == ["pending", "queued"]
    assert evs[0].at == job.created_at and evs[1].at >= job.queued_at
