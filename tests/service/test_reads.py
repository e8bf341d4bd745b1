"""Typed reads: every body a read route sends validates against the model its route declares
(`extra="forbid"`: an undocumented key fails), /openapi.json names those models, and
GET /v1/runs reads the jobs of a page of runs in a fixed number of queries."""

from __future__ import annotations

import pytest
from sqlalchemy import event

from app.artifacts.schemas import ArtifactRead
from app.core.ids import new_id
from app.core.reads import body_of, plain
from app.datasets.schemas import DatasetRead
from app.jobs.schemas import JobCreate, JobRead
from app.jobs.service import cancel_job, create_job
from app.main import create_app
from app.models import Artifact, Dataset, Run, Target
from app.runs.schemas import RunList, RunRead
from app.runs.service import run_jobs, run_models
from app.targets.schemas import TargetRead, TargetSummary
from contracts.jobtypes import JobType


def _run(db, user, n_jobs: int = 2) -> Run:
    run = Run(id=new_id("run"), name="r", owner_id=user.id, spec={"name": "r"})
    db.add(run)
    db.flush()
    for stage in ("prepare", "train", "evaluate")[:n_jobs]:
        create_job(db, user, JobCreate(type=JobType.probe, name=stage), run_id=run.id,
                   run_stage=stage)
    return run


def test_bodies_match_their_declared_models(db, user):
    run = _run(db, user)
    cancel_job(db, user, run_jobs(db, run.id)[0])  # a job with an error object
    db.flush()
    (read,) = run_models(db, [run])
    body = plain(read)
    RunRead.model_validate(body)
    assert [j["run_stage"] for j in body["jobs"]] == ["prepare", "train"]
    assert body["jobs"][0]["error"]["code"] == "cancelled"
    for j in body["jobs"]:
        JobRead.model_validate(j)
    t = Target(id=new_id("tgt"), name="t", owner_id=user.id, path="/m", tokenizer_path="/m")
    ds = Dataset(id=new_id("ds"), name="d", owner_id=user.id, status="failed", source={},
                 error={"code": "cancelled", "message": "x"})
    art = Artifact(id=new_id("art"), kind="dataset", uri="/a", bytes=3,
                   files=[{"path": "x", "bytes": 3}], inputs=[], meta={"name": "x"})
    db.add_all([t, ds, art])
    db.flush()
    for model, row in ((TargetRead, t), (TargetSummary, t), (DatasetRead, ds),
                       (ArtifactRead, art)):
        model.model_validate(body_of(model.of(row), user))  # as a member sees it


def test_a_read_is_sent_as_api_md_writes_it(db, user):
    """The model is checked, the bytes are the API's: a UTC time as `+00:00` (pydantic would
    write `Z`), a stage's progress with its own keys and integer counts (no `null`s added, no
    5 -> 5.0), a free-form field passed through whole, fields in the model's order."""
    import orjson

    from app.core.reads import typed
    from app.jobs.render import job_model

    job = create_job(db, user, JobCreate(type=JobType.probe, name="b"))
    job.progress = {"stage": "x", "done": 5, "total": 10, "unit": "rec", "tokens": 7}
    job.metrics_summary = {"deep": [[[1]]]}
    job.preemption = {"by": "job_x", "at": "2026-01-01T00:00:00+00:00", "history": [1.0]}
    raw = bytes(typed(job_model(job)).body)
    body = orjson.loads(raw)
    assert body["created_at"].endswith("+00:00") and b'"created_at":"' in raw
    assert raw.index(b'"progress":{"stage":"x","done":5,"total":10,"unit":"rec","tokens":7}') > 0
    assert body["metrics_summary"] == {"deep": [[[1]]]}
    assert list(body) == list(JobRead.model_fields)
    assert body["preemption"]["count_last_hour"] == 0 and "may_resume" in body["preemption"]
    with pytest.raises(ValueError):  # a body the model does not allow
        JobRead(**{**body, "surprise": 1})


def test_openapi_names_the_read_models():
    paths = create_app().openapi()["paths"]
    for path, model in (("/v1/jobs", "JobList"), ("/v1/jobs/{job_id}", "JobRead"),
                        ("/v1/runs", "RunList"), ("/v1/runs/{run_id}", "RunRead"),
                        ("/v1/datasets", "DatasetList"), ("/v1/datasets/{ds_id}", "DatasetRead"),
                        ("/v1/targets", "TargetList"), ("/v1/targets/{target_id}", "TargetRead"),
                        ("/v1/artifacts", "ArtifactList"), ("/v1/artifacts/{art_id}",
                                                            "ArtifactRead"),
                        ("/v1/users", "UserList"), ("/v1/users/me", "Me"),
                        ("/v1/webhooks", "HookList"), ("/v1/webhooks/{hook_id}", "HookRead"),
                        ("/v1/webhooks/{hook_id}/deliveries", "DeliveryList"),
                        ("/v1/queue", "QueueRead"), ("/v1/nodes", "NodeList")):
        schema = paths[path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{model}"}, path


def test_listing_runs_costs_the_same_queries_for_one_or_many(db, user):
    runs = [_run(db, user, 3) for _ in range(4)]
    db.flush()
    counts = []
    for page in (runs[:1], runs):
        n = [0]

        def count(*_a, n=n):
            n[0] += 1
        event.listen(db.connection(), "before_cursor_execute", count)
        body = run_models(db, page)
        event.remove(db.connection(), "before_cursor_execute", count)
        RunList(data=body, has_more=False, next_after=None)
        counts.append(n[0])
    assert counts[0] == counts[1] <= 2, counts


def test_the_polled_job_read_is_the_session_read(database):
    """GET /v1/jobs/{id} reads its row without a Session (app/jobs/render.read_job): its body
    is the one the Session's read builds, for a running job with GPUs and a preemption
    record (GPUs read too) and for a queued one (position and reason shown); an unknown id
    is the same 404."""
    from app.core.db import unit_of_work
    from app.core.errors import NotFound
    from app.jobs.render import job_models, read_job
    from app.models import Gpu, Job, Node, User

    uid = new_id("usr")
    node = f"reads-{uid}"
    run_id, queued_id = new_id("job"), new_id("job")
    with unit_of_work() as s:
        s.add(User(id=uid, name=uid, role="member"))
        s.add(Node(name=node, alive=False, cpu_slots=0))
        s.flush()
        s.add_all([
            Job(id=run_id, type="probe", owner_id=uid, status="running", priority=50,
                gpus_requested=2, node=node, inputs={"x": {"job": "job_a"}},
                params={"steps": 1}, depends_on=[], outputs=[], metrics_summary={},
                progress={"stage": "probe", "done": 1, "total": 2, "unit": "steps"},
                preemption={"by": "job_b", "attempt": 1, "history": [1.0]}),
            Job(id=queued_id, type="probe", owner_id=uid, status="queued", priority=50,
                gpus_requested=1, inputs={}, params={}, depends_on=[], outputs=[],
                metrics_summary={}, queue_position=3, pending_reason="waiting for 1 GPUs")])
        s.flush()
        s.add_all([Gpu(node=node, index=i, job_id=run_id) for i in (1, 0)])
    try:
        with unit_of_work(read_only=True) as s:
            want = [plain(m) for m in job_models(s, [s.get(Job, run_id), s.get(Job, queued_id)])]
        got = [plain(read_job(run_id)), plain(read_job(queued_id))]
        assert got == want
        assert [g["index"] for g in got[0]["gpus_assigned"]] == [0, 1]
        assert got[1]["queue_position"] == 3 and got[0]["preemption"]["by"] == "job_b"
        with pytest.raises(NotFound, match="not found"):
            read_job(new_id("job"))
    finally:
        with unit_of_work() as s:
            s.query(Node).filter(Node.name == node).delete()
            s.query(Job).filter(Job.owner_id == uid).delete()
            s.query(User).filter(User.id == uid).delete()
