"""The plan's time estimates: per stage GPU-hours, wall on the run's GPUs and disk,
from rates it names (overridable per deployment), and a config-only target refused for the
stages that run it."""

from __future__ import annotations

import json
import shutil

import pytest

from workers.stages.common import StageContext
from workers.stages.plan import run
from workers.stages.plan_time import DEFAULT_RATES, target_params
from tests.stages.records_support import write_dataset
from workers.stages.tinymodel import qwen3_tokenizer_dir

# Qwen3.6-27B's shapes (docs/FIELD-NOTES.md "The seeds' target family"): hidden 5120, 64 layers, three
# gated-delta-net layers per full-attention one, vocab 248,320.
SEEDS_CONFIG = {
    "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
    "hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 64,
    "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 16,
    "vocab_size": 248320, "tie_word_embeddings": False, "max_position_embeddings": 262144,
}


def seeds_target(folder) -> dict:
    """A config-only target: the config and the Qwen3 tokenizer, no weights."""
    shutil.copytree(qwen3_tokenizer_dir(), folder)
    (folder / "config.json").write_text(json.dumps(SEEDS_CONFIG))
    return {"kind": "target", "id": "tgt_seeds", "path": str(folder),
            "tokenizer_path": str(folder), "chat_template": None, "chat_template_kwargs": {},
            "config": SEEDS_CONFIG}


def seeds_run(mode: str = "online") -> dict:
    return {"name": "seeds", "target_id": "tgt_seeds", "dataset_id": "ds_seeds",
            "drafter": {"type": "dflash", "num_layers": 1, "block_size": 16},
            "chat_template_kwargs": {"enable_thinking": False}, "mode": mode,
            "stages": {"generate": {"max_tokens": 2048, "gpus": 8},
                       "prepare": {"seq_length": 4096},
                       "extract": None if mode == "online" else {"gpus": 8},
                       "train": {"seq_length": 4096, "epochs": 2, "gpus": 8},
                       "evaluate": {"num_prompts": 64, "max_new_tokens": 256, "gpus": 1}}}


def _plan(tmp_path, target: dict, run_body: dict, n: int = 400, rates: dict | None = None):
    write_dataset(tmp_path / "ds", [{"id": f"p{i}", "source": f"seeds:{i}", "messages": [
        {"role": "user", "content": f"Write a function that returns {i} squared."}]}
        for i in range(n)])
    spec = {"inputs": {"dataset": {"path": str(tmp_path / "ds"), "meta": {}}, "target": target},
            "params": {"run": run_body, "sample": 50, "rates": rates},
            "out_dir": str(tmp_path / "out"), "work_dir": str(tmp_path / "work")}
    return run(spec, StageContext.from_spec(spec))


def test_seeds_plan_states_time_per_stage_and_refuses_the_weightless_target(tmp_path):
    target = seeds_target(tmp_path / "seeds")
    assert 26e9 < target_params(SEEDS_CONFIG) < 29e9  # the 27B the name says
    plan = _plan(tmp_path / "a", target, seeds_run())
    t = plan["time_estimates"]
    by = {s["stage"]: s for s in t["stages"]}
    assert list(by) == ["generate", "prepare", "train", "evaluate"]
    gen = by["generate"]
    # 400 records x 2048 answer tokens (max_tokens: an upper bound) at the derived decode
    # rate, plus a prefill of ~20 prompt tokens; on 8 GPUs the wall is an eighth.
    rate = 989e12 * 0.12 / (2 * target_params(SEEDS_CONFIG))
    assert gen["gpus"] == 8 and gen["tokens"] == 400 * 2048
    assert gen["gpu_hours"] == pytest.approx(400 * 2048 / rate / 3600, rel=0.02)
    assert gen["wall_hours"] == pytest.approx(gen["gpu_hours"] / 8, abs=2e-4)
    assert by["prepare"]["gpus"] == 0 and by["prepare"]["wall_hours"] > 0
    assert by["train"]["gpus"] == 8 and by["train"]["disk_bytes"] > 0
    assert t["rates"] == DEFAULT_RATES and t["rates_from_deployment"] == []
    assert t["total_gpu_hours"] == pytest.approx(sum(s["gpu_hours"] for s in t["stages"]),
                                                 abs=0.01)
    (w,) = [c for c in plan["checks"] if c["name"] == "target_weights"]
    assert not w["ok"] and not plan["ok"]
    assert "has no weights" in w["message"] and "generate, train, evaluate" in w["message"]

    # The deployment's measured rate replaces the derived one; a bad key is named, not used.
    plan = _plan(tmp_path / "b", target, seeds_run(),
                 rates={"decode_tokens_per_s_per_gpu": rate * 2, "bogus": 1, "train_mfu": -1})
    fast = {s["stage"]: s for s in plan["time_estimates"]["stages"]}["generate"]
    assert fast["gpu_hours"] < gen["gpu_hours"] * 0.55
    assert plan["time_estimates"]["rates_from_deployment"] == ["decode_tokens_per_s_per_gpu"]
    assert any("unknown rate 'bogus'" in w for w in plan["warnings"])
    assert any("train_mfu must be a positive number" in w for w in plan["warnings"])


def test_prepare_only_needs_no_weights_and_a_weighted_target_passes(tmp_path, tiny_target):
    from tests.stages.conftest import target_input

    target = seeds_target(tmp_path / "seeds")
    body = seeds_run()
    body["stages"] = {"generate": None, "prepare": {"seq_length": 4096}, "extract": None,
                      "train": {}, "evaluate": None}
    plan = _plan(tmp_path / "a", target, body)
    (w,) = [c for c in plan["checks"] if c["name"] == "target_weights"]
    assert not w["ok"] and "train" in w["message"]  # train runs the target online
    plan = _plan(tmp_path / "b", target_input(tiny_target), body)
    (w,) = [c for c in plan["checks"] if c["name"] == "target_weights"]
    assert w["ok"], w


def test_plan_rates_setting_is_a_json_object(monkeypatch):
    from app.core.config import Settings

    monkeypatch.setenv("DRAFTYARD_PLAN_RATES", '{"decode_tokens_per_s_per_gpu": 2400}')
    assert Settings().plan_rates == {"decode_tokens_per_s_per_gpu": 2400}


def test_prepare_time_is_per_core_times_the_cores_it_gets():
    """prepare's estimate scales with the cores it runs on (the measured per-core rate), not
    one fixed rate for any machine: 2x the cores, half the hours."""
    from workers.stages.plan_time import estimate, merge_rates

    def hours(params: dict, override: dict | None = None) -> tuple[float, str]:
        rates, _, warn = merge_rates(override)
        assert not warn
        (st,) = estimate({"prepare": params}, {}, {"config": {}}, 1000, 100.0, 3.3e9, 0, rates)
        return st["wall_hours"], st["basis"]

    per_core = DEFAULT_RATES["prepare_tokens_per_s_per_core"]
    four, basis = hours({"num_workers": 4})
    assert four == pytest.approx(3.3e9 / (4 * per_core) / 3600, rel=1e-3)
    assert "x 4 cores, its num_workers" in basis
    eight, basis = hours({}, {"prepare_cores": 8})
    assert eight == pytest.approx(four / 2, rel=1e-3) and "prepare_cores" in basis
    fixed, basis = hours({"num_workers": 4}, {"prepare_tokens_per_s": 1.1e6})
    assert fixed == pytest.approx(3000 / 3600, rel=1e-3) and "prepare_tokens_per_s" in basis
    _, basis = hours({})
    assert "this server's" in basis
