"""The run report names the node each stage ran on, in `stages` and in `lineage`
(the run's input dataset through its ingest job). In-process, on the test database."""

from __future__ import annotations

from app.core.ids import new_id
from app.models import Artifact, Job, Run
from app.runs.report import build_report


def test_report_names_the_node_of_each_stage(db, user):
    run = Run(id=new_id("run"), name="r", owner_id=user.id, spec={}, status="succeeded")
    db.add(run)
    db.flush()
    jobs = {}
    for stage, node in (("prepare", "b"), ("train", "a")):
        jobs[stage] = Job(id=new_id("job"), type=stage, owner_id=user.id, status="succeeded",
                          node=node, run_id=run.id, run_stage=stage)
        db.add(jobs[stage])
    db.flush()
    for stage, kind in (("prepare", "tokenized"), ("train", "drafter")):
        db.add(Artifact(id=new_id("art"), kind=kind, uri="/x", producer_job=jobs[stage].id,
                        owner_id=user.id))
    db.flush()
    rep = build_report(db, run)
    assert {s["stage"]: s["node"] for s in rep["stages"]} == {"prepare": "b", "train": "a"}
    assert {x["stage"]: x["node"] for x in rep["lineage"]} == {"prepare": "b", "train": "a"}
