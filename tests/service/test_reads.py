"""Typed reads: every body a read route sends validates against the model its route declares
(`extra="forbid"`: an undocumented key fails), /openapi.json names those models, and
GET /v1/runs reads the jobs of a page of runs in a fixed number of queries."""

from __future__ import annotations

from fastapi.encoders import jsonable_encoder
from sqlalchemy import event

from app.artifacts.routes import artifact_read
from app.artifacts.schemas import ArtifactRead
from app.core.ids import new_id
from app.datasets.schemas import DatasetRead
from app.datasets.service import dataset_read
from app.jobs.schemas import JobCreate, JobRead
from app.jobs.service import cancel_job, create_job
from app.main import create_app
from app.models import Artifact, Dataset, Run, Target
from app.runs.schemas import RunList, RunRead
from app.runs.service import run_jobs, runs_read
from app.targets.schemas import TargetRead, TargetSummary
from app.targets.service import target_read
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
    (body,) = jsonable_encoder(runs_read(db, [run]))
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
    TargetRead.model_validate(jsonable_encoder(target_read(t, user)))
    TargetSummary.model_validate(jsonable_encoder(target_read(t, user, whole=False)))
    DatasetRead.model_validate(jsonable_encoder(dataset_read(ds)))
    ArtifactRead.model_validate(jsonable_encoder(artifact_read(art, user)))


def test_openapi_names_the_read_models():
    paths = create_app().openapi()["paths"]
    for path, model in (("/v1/jobs", "JobList"), ("/v1/jobs/{job_id}", "JobRead"),
                        ("/v1/runs", "RunList"), ("/v1/runs/{run_id}", "RunRead"),
                        ("/v1/datasets", "DatasetList"), ("/v1/datasets/{ds_id}", "DatasetRead"),
                        ("/v1/targets", "TargetList"), ("/v1/targets/{target_id}", "TargetRead"),
                        ("/v1/artifacts", "ArtifactList"), ("/v1/artifacts/{art_id}",
                                                            "ArtifactRead")):
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
        body = runs_read(db, page)
        event.remove(db.connection(), "before_cursor_execute", count)
        RunList.model_validate(jsonable_encoder({"data": body, "has_more": False,
                                                 "next_after": None}))
        counts.append(n[0])
    assert counts[0] == counts[1] <= 2, counts
