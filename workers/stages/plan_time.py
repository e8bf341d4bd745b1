"""The plan's time estimates: per stage, GPU-hours, wall time on the GPUs the run
gets, and the disk it writes, from per-GPU rates the plan names as assumptions.

Cost model (per token; P = the target's parameters from its config, Pd = the drafter's):
  generate  prefill 2P FLOPs per prompt token + decode `answer_tokens` per record at
            `decode_tokens_per_s_per_gpu` (or, when that rate is null, at `decode_mfu` of the
            GPU's peak: peak / 2P tokens/s)
  prepare   CPU: tokens / (`prepare_tokens_per_s_per_core` x cores: the prepare's num_workers,
            else `prepare_cores`, else this server's cores); bench/scale.py measures the rate;
            `prepare_tokens_per_s` set: that rate for the whole stage
  extract   2P FLOPs per token at `prefill_mfu`; writes the hidden states (the disk estimate)
  train     epochs x tokens x (2P online target forward + 6 Pd drafter step) at `train_mfu`
  evaluate  num_prompts x max_new_tokens decoded at batch 1 (`eval_tokens_per_s_per_gpu`)
GPU-hours are summed over the stage's GPUs; wall = GPU-hours / GPUs (the stage's `gpus`,
else `default_gpus`). Every rate is overridable per deployment (the server setting
DRAFTYARD_PLAN_RATES, a JSON object with any of DEFAULT_RATES' keys, e.g. the measured decode
tokens/s of the target on this hardware); the plan lists the rates it used and which came
from the deployment."""

from __future__ import annotations

from typing import Any

from contracts.jobtypes import NEEDS_TARGET_WEIGHTS
from contracts.resolved import ResolvedTarget
from contracts.target import has_weights, text_config
from workers.stages.prepare import usable_cores  # what prepare's own pool defaults to

DEFAULT_RATES: dict[str, Any] = {
    "gpu": "H100/H200-class, bf16 dense",
    "gpu_peak_tflops": 989.0,
    "prefill_mfu": 0.40,          # large-batch forward (vLLM prefill, HF extract)
    "train_mfu": 0.30,            # forward + backward
    "decode_mfu": 0.12,           # large-batch vLLM decode, memory bound
    "decode_tokens_per_s_per_gpu": None,   # null: derived from decode_mfu
    "eval_tokens_per_s_per_gpu": 60.0,     # batch-1 speculative decode of a large target
    "answer_tokens": None,        # null: generate's max_tokens per record (an upper bound)
    # bench/scale.py, 800K mixed records at seq 4096 with the Qwen3 tokenizer on 2 cores:
    # 274M tokens in 420 s, 652K tokens/s (the fast tokenizer's floor is ~0.7 of that again)
    "prepare_tokens_per_s_per_core": 3.3e5,
    "prepare_cores": None,        # null: the prepare's num_workers, else this server's cores
    "prepare_tokens_per_s": None,  # null: per core x cores
    "default_gpus": 1,
}


def merge_rates(override: dict | None) -> tuple[dict, list[str], list[str]]:
    """(rates, keys overridden, warnings about keys or values that were ignored)."""
    rates, used, warn = dict(DEFAULT_RATES), [], []
    for k, v in (override or {}).items():
        if k not in DEFAULT_RATES:
            warn.append(f"DRAFTYARD_PLAN_RATES: unknown rate {k!r} ignored "
                        f"(known: {', '.join(DEFAULT_RATES)})")
        elif k != "gpu" and v is not None and (not isinstance(v, (int, float)) or v <= 0):
            warn.append(f"DRAFTYARD_PLAN_RATES: {k} must be a positive number, got {v!r}")
        else:
            rates[k] = v
            used.append(k)
    return rates, used, warn


def target_params(config: dict) -> int:
    """Parameters of a decoder from its config: per layer 4 h^2 (attention, linear or full)
    + 3 h I (gated MLP, I = intermediate_size, else 8h/3 rounded), plus the embeddings
    (twice when untied)."""
    c = text_config(config)
    h = int(c.get("hidden_size") or 0)
    layers = int(c.get("num_hidden_layers") or 0)
    inter = int(c.get("intermediate_size") or (8 * h) // 3)
    vocab = int(c.get("vocab_size") or 0)
    tied = bool(c.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    return layers * (4 * h * h + 3 * h * inter) + vocab * h * (1 if tied else 2)


def drafter_params(config: dict, drafter: dict) -> int:
    c = text_config(config)
    h = int(c.get("hidden_size") or 0)
    inter = int(c.get("intermediate_size") or (8 * h) // 3)
    layers = int(drafter.get("num_layers") or 1)
    head = int(drafter.get("draft_vocab_size") or c.get("vocab_size") or 0)
    return layers * (4 * h * h + 3 * h * inter) + head * h + 3 * h * h  # + the fc of aux layers


def prepare_rate(params: dict, rates: dict) -> tuple[float, str]:
    """(tokens/s of the prepare stage, how it was reckoned)."""
    if rates["prepare_tokens_per_s"]:
        return float(rates["prepare_tokens_per_s"]), "prepare_tokens_per_s"
    if params.get("num_workers"):
        cores, whose = int(params["num_workers"]), "its num_workers"
    elif rates["prepare_cores"]:
        cores, whose = int(rates["prepare_cores"]), "prepare_cores"
    else:
        cores, whose = usable_cores(), "this server's; set prepare_cores for the CPU nodes"
    per_core = float(rates["prepare_tokens_per_s_per_core"])
    return per_core * cores, f"{per_core:,.0f} per core x {cores} cores, {whose}"


def _gpus(params: dict, rates: dict) -> int:
    return int(params.get("gpus") or rates["default_gpus"] or 1)


def estimate(chain: dict[str, dict], jobs_gpus: dict[str, int], target: ResolvedTarget,
             records: int, prompt_tokens: float, total_tokens: float,
             hidden_bytes: int | dict[str, int], rates: dict) -> list[dict]:
    """One entry per job of the run, `chain` keyed as the run keys its jobs (contracts/run.py:
    `train`, or `train:<drafter>` for one of several drafters): {stage (that key), gpus,
    gpu_hours, wall_hours, disk_bytes, tokens, basis}. `prompt_tokens`: mean prompt tokens
    per record; `total_tokens`: tokens prepare will write (answers included);
    `hidden_bytes`: what each extract stores (by key; an int: the one extract's)."""
    cfg = target.config
    p_target = max(1, target_params(cfg))
    peak = float(rates["gpu_peak_tflops"]) * 1e12
    out: list[dict] = []

    def add(stage: str, gpu_s: float, disk: int, tokens: float, basis: str,
            cpu_s: float = 0.0) -> None:
        g = jobs_gpus.get(stage) or _gpus(chain.get(stage) or {}, rates)
        gpu_h = gpu_s / 3600.0
        wall_h = (gpu_h / g if gpu_s else cpu_s / 3600.0)
        out.append({"stage": stage, "gpus": 0 if not gpu_s else g,
                    "gpu_hours": round(gpu_h, 4), "wall_hours": round(wall_h, 4),
                    "disk_bytes": int(disk), "tokens": round(tokens), "basis": basis})

    hidden = hidden_bytes if isinstance(hidden_bytes, dict) else {"extract": hidden_bytes}
    for key, params in chain.items():
        stage = key.partition(":")[0]
        if stage == "generate":
            gp = params
            ans = rates["answer_tokens"] or int(gp.get("max_tokens") or 256)
            dec = (rates["decode_tokens_per_s_per_gpu"]
                   or peak * rates["decode_mfu"] / (2 * p_target))
            pre_s = records * prompt_tokens * 2 * p_target / (peak * rates["prefill_mfu"])
            dec_s = records * ans / dec
            add(key, pre_s + dec_s, int(records * ans * 4 * 2), records * ans,
                f"{records:,} records x {ans:,.0f} answer tokens at {dec:,.0f} tokens/s per "
                f"GPU + prefill of {prompt_tokens:,.0f} prompt tokens at "
                f"{rates['prefill_mfu']:.0%} MFU")
        if stage == "prepare":
            tps, how = prepare_rate(params, rates)
            add(key, 0.0, int(total_tokens * 4 * 2.2), total_tokens,
                f"{total_tokens:,.0f} tokens at {tps:,.0f} tokens/s (CPU: {how})",
                cpu_s=total_tokens / tps)
        if stage == "extract":
            s = total_tokens * 2 * p_target / (peak * rates["prefill_mfu"])
            add(key, s, hidden.get(key, 0), total_tokens,
                f"{total_tokens:,.0f} tokens x 2 x {p_target / 1e9:.1f}B params at "
                f"{rates['prefill_mfu']:.0%} of {rates['gpu_peak_tflops']:g} TFLOPS")
        if stage == "train":
            tp = params
            epochs = int(tp.get("epochs") or 1)
            tokens = total_tokens * epochs
            if tp.get("max_steps"):
                g = jobs_gpus.get(key) or _gpus(tp, rates)
                tokens = min(tokens,
                             int(tp["max_steps"]) * int(tp.get("seq_length") or 1024) * g)
            p_d = drafter_params(cfg, tp.get("drafter") or {})
            online = tp.get("mode") == "online"
            flops = tokens * ((2 * p_target if online else 0) + 6 * p_d)
            add(key, flops / (peak * rates["train_mfu"]), int(p_d * 4 * 3), tokens,
                f"{epochs} epoch(s) of {tokens:,.0f} tokens x ("
                f"{f'2 x {p_target / 1e9:.1f}B target + ' if online else ''}"
                f"6 x {p_d / 1e9:.2f}B drafter params) at {rates['train_mfu']:.0%} MFU")
        if stage == "evaluate":
            ep = params
            tokens = int(ep.get("num_prompts") or 32) * int(ep.get("max_new_tokens") or 96)
            add(key, 2 * tokens / float(rates["eval_tokens_per_s_per_gpu"]), 0, tokens,
                f"{tokens:,} tokens decoded twice (target alone, with the drafter) at "
                f"{rates['eval_tokens_per_s_per_gpu']:g} tokens/s")
    return out


def weights_check(chain: dict[str, dict], target: ResolvedTarget) -> tuple[bool, str]:
    """A config-only target (no weight files) can only be prepared for."""
    stages = {key.partition(":")[0] for key in chain}  # keys: `train`, `train:<drafter>`
    need = [s for s in NEEDS_TARGET_WEIGHTS if s in stages]
    if not need or has_weights(target.path):
        return True, "the target has weights" if need else "no stage needs the target's weights"
    return False, (f"the target {target.id or target.path} has no weights "
                   f"(config and tokenizer only), and {', '.join(need)} run(s) the target; "
                   "register the model directory with its weights to run them (the plan's "
                   "estimates still hold)")
