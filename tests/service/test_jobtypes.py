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


def test_the_facts_of_a_job_type_are_read_from_its_definition():
    """Which warm starter forks a stage, which streams, what it reserves on disk and the CLI's
    list of types: derived from JOB_TYPES, never listed again."""
    from typer.testing import CliRunner

    from app.cli.main import cli
    from app.storage import reserve
    from workers.stages import starter

    def having(fact: str) -> set[str]:
        return {n for n, d in JOB_TYPES.items() if getattr(d, fact)}

    assert starter.MODEL_STAGES == having("model_stage") == {
        "generate", "extract", "train", "evaluate"}
    assert starter.DATA_STAGES == having("streaming") == {"ingest", "mix", "split"}
    assert starter.PROFILES["model"] == starter.MODEL_STAGES
    assert set(reserve.RESERVES) == having("disk") == {"extract", "prepare", "generate"}
    assert {d.disk for d in JOB_TYPES.values() if d.disk} == set(reserve.ESTIMATES)
    out = CliRunner().invoke(cli, ["submit", "--help"], terminal_width=120).output
    for name, d in JOB_TYPES.items():
        assert f"{name} " in out and d.summary in out, name
