"""One definition per job type (contracts/jobtypes.py): what the API checks at submit, what the
stage runner accepts and what the scheduler reuses all come from it."""

from __future__ import annotations

import pytest

from app.core.errors import Invalid
from app.jobs.schemas import JobCreate
from app.jobs.service import create_job
from contracts.jobtypes import JOB_TYPES, JobType
from workers.stages.__main__ import STAGES


def test_every_type_has_one_definition_and_the_stages_run_exactly_those():
    assert set(JOB_TYPES) == set(JobType)
    assert set(STAGES) == set(JOB_TYPES) | {"plan"}
    for name, d in JOB_TYPES.items():
        assert set(d.required) <= set(d.accepts) == set(d.inputs.model_fields), name
        assert not d.preemptible_by_default or d.resumable, name


@pytest.mark.parametrize("type_", [n for n, d in JOB_TYPES.items() if not d.gpu])
def test_a_cpu_only_type_asking_for_gpus_is_refused_naming_the_field(db, user, type_):
    with pytest.raises(Invalid) as e:
        create_job(db, user, JobCreate(type=JobType(type_), gpus=1))
    assert e.value.param == "gpus" and e.value.code == "cpu_only_type"
    assert f"a {type_} job runs on CPU only" in e.value.message


def test_the_preemption_rule_reads_the_definition(db, user):
    job = create_job(db, user, JobCreate(type=JobType.probe, gpus=1, preemptible=True))
    assert job.preemptible is True
    with pytest.raises(Invalid, match="cannot be preempted"):
        create_job(db, user, JobCreate(type=JobType.evaluate, preemptible=True,
                                       inputs={"target": "tgt_x", "drafter": "art_x",
                                               "data": "art_y"}))
