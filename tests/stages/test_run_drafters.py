"""A run that compares several drafters (contracts/run.py `drafters`): one expansion shares
split, generate and prepare, makes one extract per distinct set of stored layers and a train
and an evaluate per drafter; the submit check and the plan name the drafter's own field."""

from __future__ import annotations

import pytest

from app.core.errors import Invalid
from app.plans.params import name_params
from app.runs.schemas import RunCreate
from app.runs.service import check_params
from contracts.run import RunSpec
from tests.stages.typed import run_stage
from workers.stages.common import StageContext

TARGET = {"path": "/no/weights/here",
          "config": {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 8,
                     "hidden_size": 64, "vocab_size": 151936}}
THREE = [{"type": "dflash", "name": "b4", "block_size": 4, "num_layers": 1},
         {"type": "dflash", "name": "b8", "block_size": 8, "num_layers": 2},
         {"type": "eagle3", "ttt_steps": 3}]


def _run(drafters=THREE, **over) -> dict:
    body = {"name": "r", "target_id": "tgt_x", "dataset_id": "ds_x", "drafters": drafters,
            "chat_template_kwargs": {"enable_thinking": False},
            "stages": {"prepare": {"seq_length": 256}, "extract": {"dtype": "float32"},
                       "train": {"max_steps": 2}, "evaluate": {"num_prompts": 2}}}
    body.update(over)
    return body


def _jobs(body: dict):
    return check_params(RunCreate.model_validate(body))


def _refused(body: dict) -> Invalid:
    with pytest.raises(Invalid) as e:
        _jobs(body)
    return e.value


def test_three_drafters_share_the_data_stages_and_extract_by_layers():
    jobs = _jobs(_run())
    assert [j.key for j in jobs] == [
        "split", "prepare", "extract:b4", "extract:eagle3", "train:b4", "train:b8",
        "train:eagle3", "evaluate:b4", "evaluate:b8", "evaluate:eagle3"]
    by = {j.key: j for j in jobs}
    # The two dflash variants store the same layers (their type's default): one extract.
    assert by["train:b4"].inputs["hidden_states"] == by["train:b8"].inputs["hidden_states"] \
        == "@extract:b4"
    assert by["train:eagle3"].inputs["hidden_states"] == "@extract:eagle3"
    assert by["extract:eagle3"].params["drafter_type"] == "eagle3"
    assert all(by[f"train:{n}"].inputs["tokenized"] == "@prepare" for n in ("b4", "b8", "eagle3"))
    # Each drafter its own options; every evaluate on the same data with the same params.
    assert [by[f"train:{n}"].params["drafter"] for n in ("b4", "b8", "eagle3")] == [
        {"type": "dflash", "block_size": 4, "num_layers": 1},
        {"type": "dflash", "block_size": 8, "num_layers": 2},
        {"type": "eagle3", "ttt_steps": 3}]
    evs = [by[f"evaluate:{n}"] for n in ("b4", "b8", "eagle3")]
    assert {e.inputs["data"] for e in evs} == {"@split.held_out"}
    assert [e.inputs["drafter"] for e in evs] == ["@train:b4", "@train:b8", "@train:eagle3"]
    assert len({repr(e.params) for e in evs}) == 1
    assert [j.drafter for j in jobs if j.stage in ("train", "evaluate")] == ["b4", "b8", "eagle3"] * 2


def test_explicit_layers_decide_which_drafters_share_an_extract():
    same = [{**THREE[0], "target_layer_ids": [1, 4]}, {**THREE[2], "target_layer_ids": [1, 4]},
            {**THREE[1], "target_layer_ids": [2, 5]}]
    by = {j.key: j for j in _jobs(_run(same))}
    assert [k for k in by if k.startswith("extract")] == ["extract:b4", "extract:b8"]
    assert by["extract:b4"].params["layer_ids"] == [1, 4]
    assert by["train:eagle3"].inputs["hidden_states"] == "@extract:b4"
    assert by["train:b8"].inputs["hidden_states"] == "@extract:b8"
    assert by["train:eagle3"].params["drafter"]["target_layer_ids"] == [1, 4]
    # One layer set for all (stages.extract.layer_ids): one extract, keyed as in a
    # one-drafter run.
    one = _jobs(_run(stages={"extract": {"layer_ids": [1, 4]}, "evaluate": None}))
    assert [j.key for j in one if j.stage == "extract"] == ["extract"]
    assert {j.inputs["hidden_states"] for j in one if j.stage == "train"} == {"@extract"}
    # online: no extract at all
    online = _jobs(_run(mode="online", stages={"extract": None}))
    assert not [j for j in online if j.stage == "extract"]


def test_one_drafter_runs_expand_as_before():
    body = _run(None, drafter={"type": "dflash", "draft_vocab_size": 256})
    del body["drafters"]
    jobs = _jobs(body)
    assert [j.key for j in jobs] == ["split", "prepare", "extract", "train", "evaluate"]
    assert all(j.key == j.stage and j.drafter is None for j in jobs)
    assert jobs[1].params["draft_vocab_size"] == 256


def test_per_drafter_train_params_and_draft_vocab():
    d = [{**THREE[0], "draft_vocab_size": 256, "train": {"lr": 0.5}},
         {**THREE[2], "draft_vocab_size": 512}]
    by = {j.key: j for j in _jobs(_run(d))}
    assert by["train:b4"].params["lr"] == 0.5 and "lr" not in by["train:eagle3"].params
    assert by["train:b4"].params["max_steps"] == 2  # stages.train is shared
    # Two sizes: prepare caches none; each train builds its own from the token counts.
    assert "draft_vocab_size" not in by["prepare"].params
    assert by["train:eagle3"].params["drafter"]["draft_vocab_size"] == 512


@pytest.mark.parametrize("body, param, words", [
    (_run(drafter={"type": "dflash"}), "drafters", "not both"),
    ({k: v for k, v in _run().items() if k != "drafters"}, "drafter", "required"),
    (_run([THREE[0], {**THREE[1], "name": "b4"}]), "drafters.1.name", "both named 'b4'"),
    (_run([{"type": "eagle3"}, {"type": "eagle3", "ttt_steps": 2}]), "drafters.1.name",
     "distinct name"),
    (_run([THREE[0], {**THREE[0], "name": "again"}]), "drafters.1", "same drafter as drafters.0"),
    (_run([THREE[0], {**THREE[2], "block_size": 4}]), "drafters.1", "block_size applies"),
    (_run([THREE[0], {**THREE[1], "num_anchors": 0}]), "drafters.1.num_anchors", "num_anchors"),
    (_run([THREE[0], {**THREE[2], "train": {"lr": -1}}]), "drafters.1.train.lr", "lr"),
    (_run([THREE[0], {**THREE[2], "train": {"mode": "online"}}]), "drafters.1.train.mode",
     "mode"),
    (_run([THREE[0], {**THREE[2], "target_layer_ids": [2, 3]}],
          stages={"extract": {"layer_ids": [1, 4]}}), "stages.extract.layer_ids", "disagree"),
])
def test_bad_drafters_are_422_naming_the_field(body, param, words):
    e = _refused(body)
    assert e.param == param and words in e.message, (e.param, e.message)


def test_names_are_labels_without_dots_and_the_list_is_bounded():
    for bad in ("a.b", "a:b", "", "-x", "x" * 41):
        with pytest.raises(ValueError):
            RunSpec.model_validate(_run([{**THREE[0], "name": bad}]))
    with pytest.raises(ValueError):
        RunSpec.model_validate(_run([]))
    with pytest.raises(ValueError):
        RunSpec.model_validate(_run([{"type": "dflash", "name": f"d{i}", "block_size": 2 + i}
                                     for i in range(9)]))


def _plan(run: dict, tmp_path) -> dict:
    ctx = StageContext(events_path=None, out_dir=tmp_path / "out", work_dir=tmp_path / "w")
    out = run_stage("plan", {"params": {"run": run, "free_bytes_override": 1 << 40},
                             "inputs": {"target": TARGET, "dataset": None}}, ctx)
    return name_params(out, RunSpec.model_validate(run))


def test_the_plan_checks_every_drafter(tmp_path):
    out = _plan(_run(), tmp_path)
    checks = {c["name"]: c for c in out["checks"]}
    for n in ("b4", "b8", "eagle3"):
        assert checks[f"train_params:{n}"]["ok"] and checks[f"evaluate_params:{n}"]["ok"]
        assert checks[f"layer_ids:{n}"]["ok"] and checks[f"drafter_params:{n}"]["ok"]
    assert "layers [2, 4, 5]" in checks["layer_ids:eagle3"]["message"]
    assert checks["extract_params:b4"]["ok"] and checks["extract_params:eagle3"]["ok"]
    stages = [s["stage"] for s in out["time_estimates"]["stages"]]
    assert stages.count("prepare") == 1 and "train:eagle3" in stages and "extract:b4" in stages
    # One drafter's bad layer or bad param: its own check fails, naming its field.
    bad = _run([THREE[0], {**THREE[2], "target_layer_ids": [2, 40]},
                {**THREE[1], "draft_vocab_size": 10 ** 6}])
    checks = {c["name"]: c for c in _plan(bad, tmp_path)["checks"]}
    assert checks["layer_ids:b4"]["ok"] and not checks["layer_ids:eagle3"]["ok"]
    assert checks["layer_ids:eagle3"]["param"] == "drafters.1.target_layer_ids"
    assert not checks["drafter_params:b8"]["ok"]
    assert checks["drafter_params:b8"]["param"] == "drafters.2.draft_vocab_size"
    # A param the stage refuses (train): the check names the drafter's entry.
    bad = _run([THREE[0], {**THREE[2], "train": {"seq_length": 16}}])
    checks = {c["name"]: c for c in _plan(bad, tmp_path)["checks"]}
    assert not checks["train_params:eagle3"]["ok"] and checks["train_params:b4"]["ok"]
    assert checks["train_params:eagle3"]["param"] == "drafters.1.train.seq_length"
