"""Job lifecycle in-process, on the rolled-back DB fixture: every status change is announced by
`transition()` and its subscribers (app/wiring.py) follow it, whatever the call site."""

from __future__ import annotations

import os

import pytest

from app.core.ids import new_id
from app.datasets.service import get_dataset
from app.jobs import lifecycle
from app.jobs.schemas import JobCreate, JobType
from app.jobs.service import cancel_job, create_job, get_job, retry_job, transition
from app.jobs.states import S
from app.models import Dataset, Run, Target
from app.runs.service import get_run, overall_status


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
