"""One run expansion (contracts/run.py) for POST /v1/runs, its params check and the plan
stage: the plan checks exactly the jobs the run submits."""

from __future__ import annotations

import pytest

from app.core.errors import Invalid
from app.runs.schemas import RunCreate
from app.runs.service import check_params
from workers.stages import plan as plan_stage
from workers.stages.common import StageContext

TARGET = {"config": {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 8,
                     "hidden_size": 64, "vocab_size": 151936}}


def _run(**over) -> dict:
    body = {"name": "r", "target_id": "tgt_x", "dataset_id": "ds_x",
            "drafter": {"type": "dflash", "draft_vocab_size": 256},
            "chat_template_kwargs": {"enable_thinking": False},
            "stages": {"prepare": {"seq_length": 256}, "extract": {"dtype": "float32"},
                       "train": {"max_steps": 2}, "evaluate": {}}}
    for k, v in over.items():
        if k == "stages":
            body["stages"] = {**body["stages"], **v}
        else:
            body[k] = v
    return body


def _plan(run: dict, tmp_path) -> dict[str, dict]:
    ctx = StageContext(events_path=None, out_dir=tmp_path / "out", work_dir=tmp_path / "w")
    out = plan_stage.run({"params": {"run": run, "free_bytes_override": 1 << 40},
                          "inputs": {"target": TARGET, "dataset": None}}, ctx)
    return {c["name"]: c for c in out["checks"]}


def test_offline_run_without_extract_is_refused_by_both(tmp_path):
    """It used to get an extract job that the plan never checked."""
    run = _run(stages={"extract": None})
    with pytest.raises(Invalid) as e:
        check_params(RunCreate.model_validate(run))
    assert e.value.param == "stages.extract" and "online" in e.value.message
    checks = _plan(run, tmp_path)
    assert not checks["run"]["ok"] and "stages.extract" in checks["run"]["message"]
    online = _run(mode="online", stages={"extract": None})
    assert [j.stage for j in check_params(RunCreate.model_validate(online))] == [
        "split", "prepare", "train", "evaluate"]
    assert "extract_params" not in _plan(online, tmp_path)


def test_layer_ids_are_resolved_once_for_extract_train_and_the_plan(tmp_path):
    run = _run(stages={"extract": {"dtype": "float32", "layer_ids": [1, 4]}})
    jobs = {j.stage: j for j in check_params(RunCreate.model_validate(run))}
    assert jobs["extract"].params["layer_ids"] == [1, 4]
    assert jobs["train"].params["drafter"]["target_layer_ids"] == [1, 4]
    assert jobs["extract"].params["drafter_type"] == "dflash"
    assert _plan(run, tmp_path)["layer_ids"]["message"].startswith("layers [1, 4]")
    # out of range where the stage names it: the plan fails, as the extract job would
    bad = _run(stages={"extract": {"dtype": "float32", "layer_ids": [1, 9]}})
    check_params(RunCreate.model_validate(bad))  # in range of no target yet: the plan's job
    assert not _plan(bad, tmp_path)["layer_ids"]["ok"]
    # two spellings that disagree: the run used one, the plan checked the other
    both = _run(drafter={"type": "dflash", "target_layer_ids": [1, 2]},
                stages={"extract": {"dtype": "float32", "layer_ids": [1, 9]}})
    with pytest.raises(Invalid, match="disagree") as e:
        check_params(RunCreate.model_validate(both))
    assert e.value.param == "stages.extract.layer_ids"
    assert not _plan(both, tmp_path)["run"]["ok"]


def test_thinking_mode_is_pinned_for_every_template_stage(tmp_path):
    run = _run(stages={"generate": {"max_tokens": 8}})
    jobs = {j.stage: j for j in check_params(RunCreate.model_validate(run))}
    for stage in ("generate", "prepare", "evaluate"):
        assert jobs[stage].params["chat_template_kwargs"] == {"enable_thinking": False}
    assert jobs["prepare"].inputs["dataset"] == "@generate"
    assert jobs["generate"].inputs["dataset"] == "@split.train"
    assert _plan(run, tmp_path)["thinking_mode"]["ok"]
    odd = _run(stages={"evaluate": {"chat_template_kwargs": {"enable_thinking": True}}})
    msg = _plan(odd, tmp_path)["thinking_mode"]
    assert not msg["ok"] and "evaluate: enable_thinking=True" in msg["message"]


def test_a_run_without_evaluation_data_holds_records_out_before_any_stage_reads_them():
    """Evaluate measured on the rows train fit, and nothing said so."""
    jobs = check_params(RunCreate.model_validate(_run(seed=7, stages={
        "generate": {"max_tokens": 8}})))
    by = {j.stage: j for j in jobs}
    assert [j.stage for j in jobs][0] == "split"
    assert by["split"].inputs == {"dataset": "ds_x"} and by["split"].params == {"seed": 7}
    assert by["generate"].inputs["dataset"] == "@split.train"
    assert by["evaluate"].inputs["data"] == "@split.held_out"
    assert by["evaluate"].params["evaluated_on"] == "held_out"
    # in-sample is a choice the run states, and then evaluate reads prepare's rows
    ins = {j.stage: j for j in check_params(RunCreate.model_validate(
        _run(evaluation="in_sample")))}
    assert "split" not in ins and ins["prepare"].inputs["dataset"] == "ds_x"
    assert ins["evaluate"].inputs["data"] == "@prepare"
    assert ins["evaluate"].params["evaluated_on"] == "in_sample"
    # an evaluation dataset given: no split
    given = {j.stage: j for j in check_params(RunCreate.model_validate(
        _run(stages={"evaluate": {"data": "ds_eval"}})))}
    assert "split" not in given and given["evaluate"].params["evaluated_on"] == "given"
    own = {j.stage: j for j in check_params(RunCreate.model_validate(
        _run(stages={"evaluate": {"data": "@prepare"}})))}
    assert "split" not in own and own["evaluate"].params["evaluated_on"] == "in_sample"
    with pytest.raises(Invalid) as e:
        check_params(RunCreate.model_validate(_run(evaluation="in_sample", stages={
            "evaluate": {"data": "ds_eval"}})))
    assert e.value.param == "evaluation"
    # stages.split tunes the share; its params are checked like any stage's
    tuned = {j.stage: j for j in check_params(RunCreate.model_validate(_run(stages={
        "split": {"share": 0.1, "max_records": 50}})))}
    assert tuned["split"].params == {"seed": 0, "share": 0.1, "max_records": 50}
    with pytest.raises(Invalid) as e:
        check_params(RunCreate.model_validate(_run(stages={"split": {"share": 2}})))
    assert e.value.param == "stages.split.share"
    # no evaluate stage: nothing to hold out
    assert "split" not in {j.stage for j in check_params(RunCreate.model_validate(
        _run(stages={"evaluate": None})))}
