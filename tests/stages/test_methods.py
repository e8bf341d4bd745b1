"""Each drafter method beyond DFlash and EAGLE-3 (docs/methods.md), end to end on the tiny
target: the train stage trains it a few dozen steps with speculators' model class and loss,
the evaluate stage runs draftyard's greedy speculative decoding with it and with the same
drafter untrained, and the artifact carries the `vllm serve` line vLLM serves it with.

The target is the tiny Qwen3 briefly trained on a repetitive chat set (tests/stages/
train_support.py); held-out prompts come from the same distribution (docs/FIELD-NOTES.md:
evaluate on the training distribution when testing the pipeline).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.stages import train_support as ts
from tests.stages.conftest import target_input
from workers.stages.common import StageContext, StageError
from tests.stages.records_support import write_dataset

CLEAR_GAP = 1.0  # trained tau must beat untrained tau by at least this


def _train(tmp: Path, train_data, params: dict) -> tuple[dict, dict, dict]:
    """(spec, summary, the drafter artifact) of one train stage run."""
    from tests.stages.typed import run_stage

    target, tok, hs = train_data
    spec = ts.train_spec(tmp, target, tok, hs, params)
    ctx = StageContext.from_spec(spec)
    try:
        summary = run_stage("train", spec, ctx)
    finally:
        ctx.close()
    (art,) = ctx.artifacts
    return spec, summary, art


def _evaluate(tmp: Path, target: Path, drafter_dir: Path, n: int = 4,
              max_new: int = 24) -> dict:
    """The evaluate stage's report for `drafter_dir` on `n` prompts like the training ones."""
    from tests.stages.typed import run_stage

    write_dataset(tmp / "heldout", [
        {"id": f"h{i}", "source": f"test:{i}",
         "messages": [{"role": "user", "content": f"Say {ts.WORDS[i % len(ts.WORDS)]}."}]}
        for i in range(n)])
    spec = {
        "inputs": {"target": target_input(target),
                   "drafter": {"path": str(drafter_dir), "meta": {}},
                   "data": {"path": str(tmp / "heldout"), "kind": "dataset", "meta": {}}},
        "params": {"num_prompts": n, "max_new_tokens": max_new, "min_tau": 1.5,
                   "chat_template_kwargs": {"enable_thinking": False}},
        "out_dir": str(tmp / "eval_out"), "work_dir": str(tmp / "eval_work"),
    }
    run_stage("evaluate", spec)
    return json.loads((tmp / "eval_out" / "report" / "report.json").read_text())


def _served(meta: dict, target: Path) -> dict:
    """The --speculative-config of the artifact's `vllm serve` line, checked for its form."""
    line = meta["vllm_serve_command"]
    assert line.startswith(f"vllm serve {target} --speculative-config "), line
    served = json.loads(line.split("--speculative-config ", 1)[1][1:-1])
    assert served == {"model": "<drafter_path>", **meta["vllm_speculative_config"]}
    return served


def _check_learned(summary: dict, report: dict, n: int) -> None:
    assert summary["final_loss"] < 0.6 * summary["initial_loss"], summary
    base = report["baseline"]
    assert base["kind"] == "untrained"
    assert report["lossless"]["equal"] == n and base["lossless"]["equal"] == n
    assert report["tau"] >= base["tau"] + CLEAR_GAP, (report["tau"], base["tau"])
    rates = report["acceptance_rate_per_position"]
    assert rates == sorted(rates, reverse=True)
    print(json.dumps({"tau": report["tau"], "tau_untrained": base["tau"],
                      "tau_sim": report["tau_sim"], "per_position": rates}))


def _trained(tmp: Path, train_data, drafter: dict, **over) -> tuple[Any, dict, dict, Path]:
    """(the checkpoint loaded by speculators, summary, artifact, its folder) of 40 steps."""
    from speculators.model import SpeculatorModel

    params = {"drafter": drafter, "seq_length": 512, "lr": 3e-2,
              "epochs": 100, "max_steps": 40, "checkpoint_every": 100, "log_every": 5, **over}
    spec, summary, art = _train(tmp, train_data, params)
    drafter_dir = Path(spec["out_dir"]) / "drafter"
    return SpeculatorModel.from_pretrained(str(drafter_dir)), summary, art, drafter_dir


def _learns(tmp: Path, target: Path, drafter_dir: Path, summary: dict, k: int) -> None:
    report = _evaluate(tmp, target, drafter_dir)
    assert len(report["acceptance_rate_per_position"]) == k
    _check_learned(summary, report, 4)


def test_peagle_trains_evaluates_and_serves_as_parallel_eagle3(train_data, tmp_path):
    target = train_data[0]
    loaded, summary, art, drafter_dir = _trained(tmp_path, train_data,
                                                 {"type": "peagle", "num_depths": 4,
                                                  "num_anchors": 64})
    assert type(loaded).__name__ == "PEagleDraftModel"
    assert loaded.config.mask_token_id == art["meta"]["mask_token_id"] is not None
    # vLLM has no `peagle` method: its EAGLE-3 proposer drafts in parallel from the
    # checkpoint's mask token (docs/methods.md).
    assert _served(art["meta"], target) == {
        "model": "<drafter_path>", "method": "eagle3", "num_speculative_tokens": 4,
        "parallel_drafting": True}
    _learns(tmp_path, target, drafter_dir, summary, 4)


def test_dspark_trains_evaluates_and_serves_with_its_markov_head(train_data, tmp_path):
    target = train_data[0]
    # 20 steps: a DSpark step is mostly Adam over its Markov head's verifier-vocabulary
    # table (151k x rank 256), and 20 learn clearly (loss 1.24 -> 0.15, tau 4.55 vs 1.0;
    # 40 steps: -> 0.12, the same tau); the test took 27 CPU-s with 40, 17 with 20.
    loaded, summary, art, drafter_dir = _trained(tmp_path, train_data,
                                                 {"type": "dspark", "block_size": 4,
                                                  "num_anchors": 64}, max_steps=20)
    assert type(loaded).__name__ == "DSparkDraftModel"
    assert loaded.config.sample_from_anchor and loaded.markov_head is not None
    # Every slot of a block drafts, the anchor's too: block_size speculative tokens.
    assert _served(art["meta"], target) == {
        "model": "<drafter_path>", "method": "dspark", "num_speculative_tokens": 4}
    _learns(tmp_path, target, drafter_dir, summary, 4)


@pytest.fixture(scope="module")
def mtp_data(tiny_target_q35, tmp_path_factory):
    """(target, tokenized set, hidden states) as `train_data`, on the tiny Qwen3.5 hybrid
    briefly trained and then given a native MTP layer (workers/stages/tinymodel.py); the
    stored hidden states hold layer N-1 and the input of the final norm, which MTP reads."""
    from workers.stages.tinymodel import add_mtp_layers

    base = tmp_path_factory.mktemp("mtp_data")
    tok = ts.build_tokenized(tiny_target_q35, base / "tokenized")
    target = add_mtp_layers(ts.train_target(tiny_target_q35, tok, base / "target"))
    n = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    return target, tok, ts.build_hidden_states(target, tok, base / "hs", layer_ids=[n - 1])


def test_mtp_fine_tunes_the_targets_own_layer_and_serves_it_as_the_target(mtp_data,
                                                                         tmp_path):
    from safetensors import safe_open

    target = mtp_data[0]
    loaded, summary, art, drafter_dir = _trained(tmp_path, mtp_data, {
        "type": "mtp", "num_speculative_steps": 3},
        # MTP scores the full vocabulary (151k) at every position of every step, so a CPU
        # step costs what its packed row holds: one 41-token row per step (48) learns as
        # well as two (96: loss 11.4 -> 4.47, tau 4.0 vs 1.05) at a third of the CPU
        # (13 vs 45 CPU-s for 30 steps; 48: loss 11.7 -> 4.54, tau 4.0 vs 1.05).
        seq_length=48, max_steps=30)
    assert type(loaded).__name__ == "MTPDraftModel"
    # It drafts over the target's own head: the full vocabulary, whatever the default.
    assert art["meta"]["draft_vocab_size"] == loaded.config.vocab_size
    # vLLM loads MTP weights from the target checkpoint: the line serves the artifact's
    # served_target/ (the target's files, the trained MTP layer in place) as the target.
    line = art["meta"]["vllm_serve_command"]
    assert line == ("vllm serve '<drafter_path>/served_target' --speculative-config "
                    """'{"method": "mtp", "num_speculative_tokens": 3}'""")
    served = drafter_dir / "served_target"
    index = json.loads((served / "model.safetensors.index.json").read_text())["weight_map"]
    assert index["mtp.fc.weight"] == "model-mtp-trained.safetensors"
    assert (served / "config.json").resolve() == (target / "config.json").resolve()
    assert not (served / "model-mtp.safetensors").exists()  # the untrained layer
    with safe_open(str(served / index["mtp.fc.weight"]), framework="pt") as f, \
            safe_open(str(target / "model-mtp.safetensors"), framework="pt") as g:
        assert set(f.keys()) == set(g.keys())
        fc = f.get_tensor("mtp.fc.weight")
        assert fc.equal(loaded.mtp_layers[0].input_proj.weight.detach().to(fc.dtype))
        assert not fc.equal(g.get_tensor("mtp.fc.weight"))
    _learns(tmp_path, target, drafter_dir, summary, 3)


def test_mtp_is_refused_on_a_target_without_mtp_layers(train_data, tmp_path):
    with pytest.raises(StageError) as e:
        _trained(tmp_path, train_data, {"type": "mtp"})
    assert e.value.code == "invalid_params" and "mtp_num_hidden_layers" in e.value.message
