"""A config-only target (config.json and a tokenizer, no weight files) is refused at submit for
every job type that loads its weights, naming inputs.target, the target and
why; prepare, which needs only the tokenizer, is still accepted. In-process on the rolled-back
DB fixture, plus one request through the API for the error's shape."""

from __future__ import annotations

import json
import uuid

import pytest

from app.core.errors import Invalid
from app.core.ids import new_id
from app.jobs.schemas import JobCreate
from app.jobs.service import create_job
from app.models import Artifact, Dataset, Target
from contracts.jobtypes import NEEDS_TARGET_WEIGHTS, JobType

CONFIG = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4,
          "vocab_size": 128}


def _folder(root, weights: bool):
    d = root / f"tgt-{uuid.uuid4().hex[:6]}"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(CONFIG))
    (d / "tokenizer.json").write_text("{}")
    (d / "tokenizer_config.json").write_text("{}")
    if weights:
        (d / "model.safetensors").write_bytes(b"\0" * 8)
    return d


def _target(db, user, folder, name: str) -> Target:
    t = Target(id=new_id("tgt"), name=name, owner_id=user.id, path=str(folder),
               tokenizer_path=str(folder), config=CONFIG)
    db.add(t)
    db.flush()
    return t


def _artifact(db, kind: str) -> Artifact:
    a = Artifact(id=new_id("art"), kind=kind, uri=f"/nowhere/{kind}")
    db.add(a)
    db.flush()
    return a


@pytest.fixture
def world(db, user, tmp_path):
    art = _artifact(db, "dataset")
    ds = Dataset(id=new_id("ds"), name=f"d-{uuid.uuid4().hex[:6]}", owner_id=user.id,
                 status="ready", artifact_id=art.id)
    db.add(ds)
    db.flush()
    return {"config_only": _target(db, user, _folder(tmp_path, False), "qwen36-27b-config"),
            "weighted": _target(db, user, _folder(tmp_path, True), "tiny-weighted"),
            "dataset": ds.id, "tokenized": _artifact(db, "tokenized").id,
            "drafter": _artifact(db, "drafter").id}


def _inputs(w: dict, type_: str, target) -> dict:
    return {"generate": {"dataset": w["dataset"], "target": target},
            "prepare": {"dataset": w["dataset"], "target": target},
            "extract": {"tokenized": w["tokenized"], "target": target},
            "train": {"tokenized": w["tokenized"], "target": target},
            "evaluate": {"target": target, "drafter": w["drafter"],
                         "data": w["tokenized"]}}[type_]


@pytest.mark.parametrize("type_", ["generate", "extract", "train", "evaluate"])
def test_a_type_that_loads_the_weights_is_refused_on_a_config_only_target(db, user, world,
                                                                          type_):
    assert type_ in NEEDS_TARGET_WEIGHTS  # the one rule, contracts/jobtypes.py
    t = world["config_only"]
    with pytest.raises(Invalid) as e:
        create_job(db, user, JobCreate(type=JobType(type_), inputs=_inputs(world, type_, t.id)))
    err = e.value
    assert (err.status, err.code, err.param) == (422, "target_has_no_weights", "inputs.target")
    assert err.message.startswith(f"inputs.target: {type_} {NEEDS_TARGET_WEIGHTS[type_]}: "
                                  f"target 'qwen36-27b-config' ({t.id}) has no weights")
    assert "register it from a folder with its weights" in err.message
    assert err.details["target_id"] == t.id and err.details["type"] == type_
    assert set(err.details["needs_weights"]) == {"generate", "extract", "train", "evaluate"}
    # the same job on a target with weights is accepted
    job = create_job(db, user, JobCreate(type=JobType(type_),
                                         inputs=_inputs(world, type_, world["weighted"].id)))
    assert job.status in ("pending", "queued")


def test_prepare_needs_only_the_tokenizer_and_is_accepted(db, user, world):
    job = create_job(db, user, JobCreate(
        type=JobType.prepare, inputs=_inputs(world, "prepare", world["config_only"].id)))
    assert job.status == "queued"


def test_a_target_named_through_a_job_is_the_same_rule(db, user, world):
    prep = create_job(db, user, JobCreate(
        type=JobType.prepare, inputs=_inputs(world, "prepare", world["config_only"].id)))
    with pytest.raises(Invalid) as e:
        create_job(db, user, JobCreate(type=JobType.generate, inputs=_inputs(
            world, "generate", {"job": prep.id})))
    assert e.value.code == "target_has_no_weights" and e.value.param == "inputs.target"
    assert f"through job {prep.id}" in e.value.message
    assert e.value.details["via_jobs"] == [prep.id]


def test_the_refusal_through_the_api_keeps_the_error_shape(api, home):
    folder = _folder(home / "models", False)
    name = f"cfg-only-{uuid.uuid4().hex[:4]}"
    r = api.post("/v1/targets", {"name": name, "path": str(folder)})
    assert r.status_code == 201, r.text
    tgt = r.json()["id"]
    data = home / "data" / f"w-{uuid.uuid4().hex[:6]}.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    ds = api.post("/v1/datasets", {"name": name, "path": str(data)})
    assert ds.status_code in (200, 201, 202), ds.text
    r = api.post("/v1/jobs", {"type": "generate",
                              "inputs": {"dataset": ds.json()["id"], "target": tgt}})
    assert r.status_code == 422, r.text
    body = r.json()["error"]
    assert set(body) == {"code", "message", "param", "details"}
    assert (body["code"], body["param"]) == ("target_has_no_weights", "inputs.target")
    assert f"target '{name}' ({tgt}) has no weights" in body["message"]
    print(json.dumps(r.json(), indent=1))


def test_a_forced_run_is_refused_too_naming_its_target_and_stage(db, user, world):
    """force_plan starts a run whose plan has errors; it does not give the target weights."""
    from app.runs.service import check_params, create_run
    from contracts.run import RunSpec
    from tests.stages.test_plan_time import seeds_run

    body = RunSpec.model_validate({**seeds_run("online"), "force_plan": True,
                                   "target_id": world["config_only"].id,
                                   "dataset_id": world["dataset"]})
    with pytest.raises(Invalid) as e:
        create_run(db, user, body, check_params(body))
    assert (e.value.code, e.value.param) == ("target_has_no_weights", "target_id")
    assert e.value.message.startswith("target_id: stages.generate: generate runs the target")
