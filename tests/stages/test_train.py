"""The train stage on CPU with the tiny Qwen3 target: DFlash and EAGLE-3 learn, the drafter
reloads with speculators, and online (in-process HF) hidden states match offline ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.stages import train_support as ts
from tests.stages.typed import run_stage, train_job
from workers.stages.common import StageContext


def _run(spec: dict) -> tuple[dict, StageContext]:
    ctx = StageContext.from_spec(spec)
    try:
        return run_stage("train", spec, ctx), ctx
    finally:
        ctx.close()


def test_dflash_trains_and_saves_a_reloadable_drafter(train_data, tmp_path):
    from speculators.model import SpeculatorModel

    from workers.stages.train import build

    target, tok, hs = train_data
    spec = ts.train_spec(tmp_path, target, tok, hs, ts.dflash_params(max_steps=30))
    summary, ctx = _run(spec)

    assert summary["steps"] == 30 and summary["total_steps"] == 30
    # The loss of step 1 (before any update) against the last logged window (speculators'
    # default DFlash loss: CE with D-PACE position weights).
    assert summary["final_loss"] < 0.6 * summary["initial_loss"], summary
    metrics = ts.events(spec, "metric")
    assert metrics[0]["data"]["step"] == 1 and metrics[-1]["data"]["step"] == 30
    first, last = metrics[0]["data"], metrics[-1]["data"]
    assert last["acc_1"] > first["acc_1"] + 0.4, (first, last)  # learned the next token
    assert {"loss", "lr", "tokens_per_s", "acc_7"} <= set(metrics[-1]["data"])
    assert any(p.name.startswith("events.out.tfevents")
               for p in (Path(spec["work_dir"]) / "tb").iterdir())

    (art,) = ctx.artifacts
    assert art["kind"] == "drafter" and art["path"] == "drafter"
    meta = art["meta"]
    assert meta["type"] == "dflash" and meta["steps"] == 30 and meta["layer_ids"] == ts.LAYER_IDS
    assert meta["draft_vocab_size"] == 2048 and meta["seq_length"] == 512
    assert meta["vllm_speculative_config"] == {"method": "dflash", "num_speculative_tokens": 7}
    assert meta["vllm_serve_command"].startswith(f"vllm serve {target} --speculative-config ")
    served = json.loads(meta["vllm_serve_command"].split("--speculative-config ", 1)[1][1:-1])
    assert served == {"model": "<drafter_path>", "method": "dflash",
                      "num_speculative_tokens": 7}

    drafter_dir = Path(spec["out_dir"]) / "drafter"
    cfg = json.loads((drafter_dir / "config.json").read_text())
    assert cfg["speculators_config"]["algorithm"] == "dflash"
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == str(target)
    assert cfg["aux_hidden_state_layer_ids"] == ts.LAYER_IDS
    assert (drafter_dir / "model.safetensors").is_file()

    loaded = SpeculatorModel.from_pretrained(str(drafter_dir))
    assert type(loaded).__name__ == "DFlashDraftModel"
    # The same construction the stage starts from (same seed) gives the initial weights.
    job = train_job(spec, "offline")
    torch.manual_seed(0)
    initial = build.build_model(job)
    trained_sd, initial_sd = loaded.state_dict(), initial.state_dict()
    trainable = [n for n, p in initial.named_parameters() if p.requires_grad]
    assert "fc.weight" in trainable and len(trainable) > 5
    changed = [n for n in trainable if not torch.equal(trained_sd[n], initial_sd[n])]
    assert set(changed) == set(trainable)
    # Frozen verifier parts come back from the target, identical.
    assert torch.equal(trained_sd["embed_tokens.weight"], initial_sd["embed_tokens.weight"])
    assert torch.equal(trained_sd["d2t"], initial_sd["d2t"])


def test_progress_every_step_with_a_rate_from_the_first(train_data, tmp_path):
    """Steps slower than the progress throttle (here: any step, the throttle set to 0) are
    each reported, whatever log_every says; the report before the first step starts the
    rate's clock, so the job shows a rate and an ETA once step 1 is done (a train of
    one-minute steps showed "1/42" and no rate for log_every minutes)."""
    from workers.supervisor import _Rate

    target, tok, hs = train_data
    spec = ts.train_spec(tmp_path, target, tok, hs, ts.dflash_params(
        max_steps=5, log_every=100, checkpoint_every=100))
    ctx = StageContext.from_spec(spec)
    ctx.min_progress_interval_s = 0.0
    try:
        run_stage("train", spec, ctx)
    finally:
        ctx.close()
    prog = ts.events(spec, "progress")
    assert [(e["data"]["done"], e["data"]["total"]) for e in prog] == \
        [(i, 5) for i in range(6)], prog
    assert {e["data"]["stage"] for e in prog} == {"train"}
    rate = _Rate()  # as the supervisor computes the job's rate and ETA from these reports
    rates = [rate.add(e["at"], e["data"]["done"]) for e in prog]
    assert rates[0] is None and all(r and r > 0 for r in rates[1:]), rates


def test_eagle3_trains(train_data, tmp_path):
    target, tok, hs = train_data
    params = {"drafter": {"type": "eagle3", "ttt_steps": 3}, "seq_length": 256,
              "lr": 3e-2, "epochs": 100, "max_steps": 16, "log_every": 4,
              "checkpoint_every": 100, "val_fraction": 0.25, "eval_every": 8}
    spec = ts.train_spec(tmp_path, target, tok, hs, params)
    summary, ctx = _run(spec)
    assert summary["steps"] == 16
    # Default EAGLE-3 loss is speculators' kl_div summed over the 3 TTT steps.
    assert summary["final_loss"] < 0.4 * summary["initial_loss"], summary
    metrics = [e["data"] for e in ts.events(spec, "metric")]
    train = [m for m in metrics if "loss" in m]
    first, last = train[0], train[-1]
    assert last["acc_1"] > first["acc_1"] + 0.3, (first, last)
    assert {"acc_2", "acc_3", "cond_acc_3"} <= set(last)
    # Held-out rows (the last quarter) evaluated at step 8 and at the end.
    val = [m for m in metrics if "val_loss" in m]
    assert [m["step"] for m in val] == [8, 16] and val[1]["val_loss"] < val[0]["val_loss"]
    assert summary["val"]["val_loss"] == val[1]["val_loss"]
    meta = ctx.artifacts[0]["meta"]
    assert meta["vllm_speculative_config"] == {"method": "eagle3", "num_speculative_tokens": 3}

    from speculators.model import SpeculatorModel

    loaded = SpeculatorModel.from_pretrained(str(Path(spec["out_dir"]) / "drafter"))
    assert type(loaded).__name__ == "Eagle3DraftModel"
    assert loaded.config.eagle_aux_hidden_state_layer_ids == ts.LAYER_IDS


def test_online_hf_hidden_states_match_offline(train_data, tmp_path):
    """Online mode without vLLM computes hidden states with the HF target in-process; the
    first step's loss must equal the offline run's on the same rows (same seed)."""
    target, tok, hs = train_data
    params = ts.dflash_params(max_steps=2, log_every=1)
    offline, _ = _run(ts.train_spec(tmp_path, target, tok, hs, params, name="off"))
    online_params = {**params, "mode": "online",
                     "drafter": {**params["drafter"], "target_layer_ids": ts.LAYER_IDS}}
    spec = ts.train_spec(tmp_path, target, tok, None, online_params, name="on")
    online, ctx = _run(spec)
    assert online["hidden_states_source"] == "hf"
    assert online["initial_loss"] == pytest.approx(offline["initial_loss"], rel=1e-4)
    assert online["final_loss"] == pytest.approx(offline["final_loss"], rel=1e-3)
    assert ctx.artifacts[0]["meta"]["hidden_states_source"] == "hf"
