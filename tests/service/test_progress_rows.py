"""Progress at scale: a stage that reports progress as fast as it likes gets at most
about one progress event row per second of its run in the database, the first and the final
report always, while the job's `progress` field follows every report."""

from __future__ import annotations

from sqlalchemy import func, select

from app.core.ids import new_id
from app.models import Job, JobEvent
from contracts.spec import StageSpec
from workers.attempt import Attempt
from workers.supervisor import Supervisor


def _running(db, user, tmp_path, type_: str = "prepare") -> tuple[Job, Supervisor]:
    """A running job in the database and the supervisor of its attempt."""
    job = Job(id=new_id("job"), type=type_, owner_id=user.id, status="running",
              priority=50, gpus_requested=0)
    db.add(job)
    db.flush()
    spec = StageSpec(type=job.type, out_dir=str(tmp_path / "out"), work_dir=str(tmp_path / "w"),
                     events_path=str(tmp_path / "ev.jsonl"))
    return job, Supervisor(Attempt(job.id, 1, tmp_path, spec, tmp_path / "spec.json", []))


def test_progress_rows_are_at_most_one_per_second(db, user, tmp_path):
    job, sup = _running(db, user, tmp_path)
    t0, n = 1_000_000.0, 5000
    # 5,000 reports over 2.5 s of the stage's clock (a record loop reporting every item,
    # replayed in one pump, as after a database outage)
    for i in range(1, n + 1):
        sup._apply(db, job, {"kind": "progress", "at": t0 + i * 0.0005,
                             "data": {"stage": "prepare", "done": i, "total": n,
                                      "unit": "records"}})
        assert job.progress["done"] == i
    db.flush()
    rows = db.scalars(select(JobEvent.data).where(JobEvent.job_id == job.id,
                                                  JobEvent.kind == "progress")
                      .order_by(JobEvent.id)).all()
    assert 3 <= len(rows) <= 4, len(rows)  # t=0, 1 s, 2 s, and the final report
    assert rows[0]["done"] == 1 and rows[-1]["done"] == n
    assert rows[-1]["eta_s"] == 0 or rows[-1]["eta_s"] is None
    assert db.scalar(select(func.count()).select_from(JobEvent)
                     .where(JobEvent.job_id == job.id)) == len(rows)


def test_a_long_job_writes_a_bounded_number_of_progress_rows(db, user, tmp_path):
    """A 3-hour stage reporting every half second: ~300 x (1 + ln(10,800 / 300)) rows (the
    spacing grows past 300 rows), not 10,800."""
    job, sup = _running(db, user, tmp_path, "generate")
    n = 21_600
    for i in range(1, n + 1):
        sup._apply(db, job, {"kind": "progress", "at": 5_000.0 + i * 0.5,
                             "data": {"done": i, "total": n, "unit": "records"}})
    db.flush()
    rows = db.scalar(select(func.count()).select_from(JobEvent)
                     .where(JobEvent.job_id == job.id, JobEvent.kind == "progress"))
    assert 300 <= rows <= 1_500, rows


def test_eta_at_ten_percent_of_a_stage_reporting_in_chunks(db, user, tmp_path):
    """A stage whose work comes in chunks 40 s apart (prepare's tasks on a busy node): at 10%
    the job shows an ETA, within 25% of the time that remained (a 30 s window held one point:
    no rate, no ETA), and it follows a slowdown later on."""
    job, sup = _running(db, user, tmp_path)
    total, t = 100_000, 10_000.0
    sup._apply(db, job, {"kind": "progress", "at": t,
                         "data": {"done": 0, "total": total, "unit": "records"}})
    for k in range(1, 21):
        t += 40.0
        sup._apply(db, job, {"kind": "progress", "at": t,
                             "data": {"done": 5000 * k, "total": total, "unit": "records"}})
        if 5000 * k == 10_000:
            remained = 10_800.0 - t
            assert job.progress["eta_s"] is not None
            assert abs(job.progress["eta_s"] - remained) <= 0.25 * remained, job.progress


def test_metric_rows_are_spaced_and_the_last_one_is_always_written(db, user, tmp_path,
                                                                   monkeypatch):
    """A train logging a metric every 0.1 s: every point of its first 100 s (a short train's
    curve is whole), then rows spaced by elapsed / METRIC_EVENTS (over 2,000 s: ~4,000
    rows, not 20,000); the metric of its last step is written when the stage exits even
    though the spacing held it back."""
    import contextlib
    import json

    import workers.supervisor as sv

    @contextlib.contextmanager
    def same_session():  # the supervisor's writes go into this test's transaction
        yield db
        db.flush()

    monkeypatch.setattr(sv, "unit_of_work", same_session)
    job, sup = _running(db, user, tmp_path, "train")
    n = 20_000
    with open(tmp_path / "ev.jsonl", "w") as f:
        for step in range(1, n + 1):
            f.write(json.dumps({"kind": "metric", "at": 7_000.0 + step * 0.1,
                                "data": {"step": step, "loss": 10.0 / step}}) + "\n")
    sup._pump_events(heartbeat=False)

    def steps() -> list[int]:
        return [d["step"] for d in db.scalars(
            select(JobEvent.data).where(JobEvent.job_id == job.id, JobEvent.kind == "metric")
            .order_by(JobEvent.id))]

    written = steps()
    assert written[:1000] == list(range(1, 1001))  # the first 100 s: every step
    assert 3_000 <= len(written) <= 5_000, len(written)
    assert written[-1] < n  # the last step is held back while the stage runs
    sup._pump_events(heartbeat=False, final=True)  # the stage has exited
    assert steps() == [*written, n]
    sup._pump_events(heartbeat=False, final=True)
    assert steps() == [*written, n]  # once
