"""The stage kernel: one shape of a params or input error for every stage, through
the real entry point; one validity rule of target layer ids wherever ids are checked; the
resumable scratch folder and the publishing of a finished one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workers.stages.common import StageContext, StageError

REPO = Path(__file__).resolve().parents[2]

# Params each stage accepts (train needs its drafter type); a bad field is added to them.
GOOD_PARAMS = {"ingest": {}, "mix": {}, "generate": {}, "prepare": {}, "extract": {},
               "train": {"drafter": {"type": "dflash"}}, "evaluate": {}}


def _run_stage(tmp_path: Path, stage: str, params: dict, inputs: dict) -> tuple[int, dict]:
    """`python -m workers.stages <stage>` on a spec; (exit status, its error event)."""
    spec = {"type": stage, "params": params, "inputs": inputs,
            "out_dir": str(tmp_path / "out"), "work_dir": str(tmp_path / "work"),
            "events_path": str(tmp_path / "events.jsonl")}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    p = subprocess.run([sys.executable, "-m", "workers.stages", stage, "--spec", str(path)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    errors = [e["data"] for e in events if e["kind"] == "error"]
    assert errors, p.stderr[-2000:]
    return p.returncode, errors[-1]


def _assert_one_shape(err: dict) -> list[dict]:
    """message "<field>: <msg>" for every problem joined by "; ", details {"errors": [...]}."""
    assert set(err["details"]) == {"errors"}, err
    errors = err["details"]["errors"]
    assert errors and all(set(x) == {"field", "message"} for x in errors), err
    assert err["message"] == "; ".join(f"{x['field']}: {x['message']}" for x in errors), err
    return errors


@pytest.mark.parametrize("stage", sorted(GOOD_PARAMS))
def test_every_stage_reports_bad_params_in_one_shape(stage, tmp_path):
    params = {**GOOD_PARAMS[stage], "bogus_field": 1, "other_bogus": "x"}
    rc, err = _run_stage(tmp_path, stage, params, {})
    assert rc == 2 and err["code"] == "invalid_params", err
    errors = _assert_one_shape(err)
    assert [x["field"] for x in errors] == ["params.bogus_field", "params.other_bogus"]
    assert {x["message"] for x in errors} == {"Extra inputs are not permitted"}


@pytest.mark.parametrize("stage, field", [
    ("ingest", "inputs.source"), ("mix", "inputs.sources"), ("generate", "inputs.dataset"),
    ("prepare", "inputs.dataset"), ("extract", "inputs.tokenized"), ("train", "inputs.target"),
    ("evaluate", "inputs.target"),
])
def test_every_stage_reports_a_missing_input_in_the_same_shape(stage, field, tmp_path):
    rc, err = _run_stage(tmp_path, stage, GOOD_PARAMS[stage], {})
    assert rc == 2 and err["code"] == "invalid_input", err
    assert [x["field"] for x in _assert_one_shape(err)] == [field]


# -- one rule for target layer ids ----------------------------------------------------------

N = 8  # decoder layers of the target below; id 8 is the input of its final norm
TARGET = {"model_type": "qwen3", "num_hidden_layers": N, "hidden_size": 64, "vocab_size": 32}
CASES = [[1, 4, 7], [0], [7], [], [4, 4], [-1, 2], [8], [2, 9], [1, 8]]
NEEDS_NO_TARGET = {(), (4, 4), (-1, 2)}  # refused whatever the target


def _accepts(check) -> bool:
    try:
        check()
    except (StageError, ValueError):  # pydantic's ValidationError is a ValueError
        return False
    return True


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory):
    import datasets
    import torch

    tok = tmp_path_factory.mktemp("tok")
    ids = [[5, 6, 7, 8], [9, 10, 11]]
    datasets.Dataset.from_dict({"input_ids": ids, "loss_mask": [[1] * len(x) for x in ids],
                                "seq_len": [len(x) for x in ids]}).save_to_disk(str(tok))
    torch.save({i: 1 for x in ids for i in x}, tok / "token_freq.pt")
    return tok


@pytest.mark.parametrize("ids", CASES, ids=str)
def test_layer_ids_are_accepted_or_refused_alike_everywhere(ids, tokenized, tmp_path):
    from contracts.extract import ExtractParams
    from contracts.train import DrafterParams, TrainParams
    from workers.stages.evaluate.drafter import DrafterSpec, check_fit
    from workers.stages.extract.layers import resolve_layers
    from workers.stages.train.job import resolve_job

    def extract() -> None:
        p = ExtractParams.model_validate({"layer_ids": ids})
        resolve_layers(TARGET, p.drafter_type, p.layer_ids)

    def train() -> None:  # online: the stage resolves the ids against the target itself
        raw = {"mode": "online", "drafter": {"type": "dflash", "target_layer_ids": ids,
                                             "mask_token_id": 3, "draft_vocab_size": 16}}
        spec = {"inputs": {"target": {"path": str(tmp_path), "config": TARGET},
                           "tokenized": {"path": str(tokenized)}},
                "out_dir": str(tmp_path / "out"), "work_dir": str(tmp_path / "work")}
        resolve_job(spec, TrainParams.model_validate(raw), "hf", cuda=False)

    def evaluate() -> None:  # a drafter checkpoint that taps these layers
        check_fit(DrafterSpec(path=tmp_path, kind="dflash", hidden_size=64, vocab_size=32,
                              draft_vocab_size=32, aux_layer_ids=list(ids),
                              num_speculative_tokens=7, t2d_len=None, d2t_len=None,
                              verifier=None), TARGET)

    verdicts = {"extract": _accepts(extract), "train": _accepts(train),
                "evaluate": _accepts(evaluate)}
    valid = bool(ids) and len(set(ids)) == len(ids) and all(0 <= i < N for i in ids)
    assert verdicts == dict.fromkeys(verdicts, valid)
    # Without a target (a submitted job, a run's body) the contracts refuse exactly what
    # no target can make valid, and let the stage judge the range.
    no_target = {
        "extract params": _accepts(lambda: ExtractParams.model_validate({"layer_ids": ids})),
        "train params": _accepts(lambda: DrafterParams.model_validate(
            {"type": "dflash", "target_layer_ids": ids})),
    }
    assert no_target == dict.fromkeys(no_target, tuple(ids) not in NEEDS_NO_TARGET)


def test_the_layer_rule_has_one_home():
    """Every checker reaches the rule in contracts/ (imported, not copied)."""
    from contracts import target
    from workers.stages.evaluate import drafter
    from workers.stages.extract import layers

    assert drafter.layer_ids_problem is layers.layer_ids_problem is target.layer_ids_problem
    assert drafter.text_config is layers.text_config is target.text_config
    p = target.layer_ids_problem([1, 8], N, "drafter.target_layer_ids")
    assert p is not None and p.details == {"field": "drafter.target_layer_ids", "invalid": [8],
                                           "valid_range": [0, N - 1]}
    assert "always stored last" in p.message
    assert target.text_value({"text_config": {"num_hidden_layers": 2, "vocab_size": 7}},
                             "vocab_size") == 7
    assert target.text_value({"text_config": {"max_position_embeddings": 9}},
                             "max_position_embeddings") == 9


def test_one_template_identity():
    from workers.stages import common
    from workers.stages.evaluate import params as eval_params
    from workers.stages.prepare import templates

    assert templates.template_sha256 is common.template_sha256
    assert not hasattr(eval_params, "template_sha256")


# -- resumable scratch and publishing ---------------------------------------------------------

def test_shard_set_commits_whole_pieces_and_drops_another_configuration(tmp_path):
    from workers.stages.kernel import ShardSet

    s = ShardSet(tmp_path / "pieces", tmp_path / "state.json", "part-", ".txt")
    assert s.open({"v": 1}) and s.done() == {}
    s.commit(3, lambda tmp: tmp.write_text("three"), width=4)
    s.commit(1, lambda tmp: tmp.write_text("one"), width=4, fsync=True)
    with pytest.raises(RuntimeError):  # a writer that dies leaves neither piece nor temp
        s.commit(2, lambda tmp: (tmp.write_text("half"), (_ for _ in ()).throw(
            RuntimeError("killed")))[0], width=4)
    assert [p.name for p in s.done().values()] == ["part-0001.txt", "part-0003.txt"]
    assert sorted(p.name for p in s.folder.iterdir()) == ["part-0001.txt", "part-0003.txt"]
    (s.folder / ".part-0004.txt.tmp99.1").write_text("left by a kill")
    (s.folder / ".tmpm2RpN4").write_text("a library's own temp (safetensors 0.8), killed")
    assert not s.stale({"v": 1}) and s.open({"v": 1})             # same config: kept
    assert sorted(s.done()) == [1, 3]
    assert sorted(p.name for p in s.folder.iterdir()) == ["part-0001.txt", "part-0003.txt"]
    assert s.stale({"v": 2}) and s.previous() == {"v": 1}        # read-only question
    assert sorted(s.done()) == [1, 3]
    assert not s.open({"v": 2}) and s.done() == {}               # another config: dropped
    assert json.loads(s.state_path.read_text()) == {"v": 2}


def test_publish_moves_the_folder_with_its_manifest(tmp_path):
    from workers.stages.kernel import ShardSet, publish

    ctx = StageContext.from_spec({"out_dir": str(tmp_path / "out"),
                                  "work_dir": str(tmp_path / "work"),
                                  "events_path": str(tmp_path / "ev.jsonl")})
    s = ShardSet(ctx.work_dir / "hs", ctx.work_dir / "state.json", "hs_", ".bin")
    s.open({"v": 1})
    s.commit(0, lambda tmp: tmp.write_bytes(b"x"))
    (ctx.out_dir / "hs").mkdir()  # left by an attempt that died before declaring it
    final = publish(ctx, s.folder, "hs", "hidden_states", {"n": 1})
    assert final == ctx.out_dir / "hs" and not s.folder.exists()
    assert sorted(p.name for p in final.iterdir()) == ["hs_0.bin", "meta.json"]
    assert ctx.artifacts == [{"name": "hs", "kind": "hidden_states", "path": "hs",
                              "meta": {"n": 1}}]
    # A retry that finds the published folder takes it back instead of redoing it.
    assert s.recover(final) and sorted(s.done()) == [0]
    ctx.close()
