"""Benchmark: the generate stage's transformers backend against a bare `model.generate` loop
on the same prompts, measured in the same run.

    python bench/generate.py             # 128 prompts, 64 new tokens, batch 32
    python bench/generate.py --quick     # 32 prompts, 32 new tokens, batch 16
    python bench/generate.py --model DIR --prompts N --max-tokens T --batch-size B --repeat R

Target: the tiny random Qwen3 (hidden 64, 8 layers, real 151k-token tokenizer) built locally,
unless --model names another. Prompts: seeded user questions of 5-150 words (so batches
need padding), rendered with the target's template, thinking off. Greedy.

baseline = a bare loop: load model and tokenizer, render and tokenize, then for each batch of
           prompts in input order: left-pad, `model.generate(max_new_tokens=T)` (default
           cache), count generated tokens up to EOS.
stage    = `workers.stages.generate.run` end to end with backend hf: load, render, sort by
           length, batch, write shards, assemble the artifact.
tokens/s = generated tokens / wall time of each, model loading included in both
           ("end_to_end"), and generated tokens / time inside the generate calls only
           ("generation": the backend itself, without loading, rendering and writing).
The last line is the JSON result, one object per measure: ratio = stage tokens/s /
baseline tokens/s (target >= 0.8 for both).
Run it alone (docs/FIELD-NOTES.md: torch slows many-fold when another process competes for cores).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import emit, result

WORDS = ("the of and to in is for that with as on are this be by from it at an or which "
         "model token data train value function return list string number result error file "
         "system python code example output input layer batch memory speed draft target "
         "decode accept sample prompt answer question because however therefore").split()


def make_prompts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 150))) + "?"
            for _ in range(n)]


def bare_loop(model_dir: Path, prompts: list[str], max_tokens: int, batch: int) -> dict:
    """What a person would write: the plain transformers generate loop."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    eos_set = set(eos if isinstance(eos, list) else [eos])
    ids = [tok(tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                       add_generation_prompt=True, enable_thinking=False),
               add_special_tokens=False)["input_ids"] for p in prompts]
    tokens, outputs = 0, []
    t_gen = time.perf_counter()
    for start in range(0, len(ids), batch):
        chunk = ids[start:start + batch]
        width = max(map(len, chunk))
        x = torch.full((len(chunk), width), tok.pad_token_id, dtype=torch.long)  # [B, W]
        mask = torch.zeros_like(x)
        for r, c in enumerate(chunk):
            x[r, width - len(c):] = torch.tensor(c)
            mask[r, width - len(c):] = 1
        with torch.inference_mode():
            out = model.generate(input_ids=x, attention_mask=mask, do_sample=False,
                                 max_new_tokens=max_tokens, pad_token_id=tok.pad_token_id)
        for row in out[:, width:].tolist():
            cut = next((j + 1 for j, t in enumerate(row) if t in eos_set), len(row))
            outputs.append(row[:cut])
            tokens += cut
    end = time.perf_counter()
    return {"tokens": tokens, "seconds": end - t0, "outputs": outputs,
            "gen_only_tps": tokens / (end - t_gen)}


def stage_run(model_dir: Path, prompts: list[str], max_tokens: int, batch: int,
              root: Path) -> dict:
    import json

    import pyarrow.parquet as pq

    from workers.stages.common import StageContext
    from workers.stages.generate import run
    from tests.stages.records_support import write_dataset

    write_dataset(root / "in", [{"id": f"p{i:05d}", "source": f"bench:{i}",
                                 "messages": [{"role": "user", "content": p}]}
                                for i, p in enumerate(prompts)])
    cfg = json.loads((model_dir / "config.json").read_text())
    spec = {"inputs": {"dataset": {"path": str(root / "in"), "meta": {}},
                       "target": {"path": str(model_dir), "tokenizer_path": str(model_dir),
                                  "chat_template": None, "chat_template_kwargs": {},
                                  "config": cfg}},
            "params": {"backend": "hf", "max_tokens": max_tokens, "batch_size": batch,
                       "chat_template_kwargs": {"enable_thinking": False}},
            "out_dir": str(root / "out"), "work_dir": str(root / "work")}
    ctx = StageContext.from_spec(spec)
    t0 = time.perf_counter()
    summary = run(spec, ctx)
    seconds = time.perf_counter() - t0
    rows = pq.read_table(root / "out" / "dataset" / "token_ids.parquet").to_pylist()
    by_id = {r["id"]: r["completion_ids"] for r in rows}
    meta = json.loads((root / "out" / "dataset" / "meta.json").read_text())
    return {"tokens": summary["tokens_generated"], "seconds": seconds,
            "outputs": [by_id[f"p{i:05d}"] for i in range(len(prompts))],
            "gen_only_tps": meta["stats"]["tokens_per_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--model", type=Path, default=None, help="a local model dir (default: "
                    "build the tiny Qwen3 target)")
    ap.add_argument("--prompts", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each, order alternated; "
                    "the best of each is reported")
    a = ap.parse_args()
    n = a.prompts or (32 if a.quick else 128)
    max_tokens = a.max_tokens or (32 if a.quick else 64)
    batch = a.batch_size or (16 if a.quick else 32)
    import torch

    threads = int(os.environ.get("OMP_NUM_THREADS", "0")) or torch.get_num_threads()
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="bench_generate_") as tmp:
        root = Path(tmp)
        model_dir = a.model
        if model_dir is None:
            from workers.stages.tinymodel import build_tiny_target

            model_dir = build_tiny_target(root / "target", arch="qwen3")
        prompts = make_prompts(n)
        bases, stages = [], []
        # Alternate the order (B S, S B, ...) and keep each one's best run: on a shared
        # machine the load changes during a run, and best-of is the least disturbed.
        for rep in range(a.repeat):
            order = ("base", "stage") if rep % 2 == 0 else ("stage", "base")
            for which in order:
                if which == "base":
                    bases.append(bare_loop(model_dir, prompts, max_tokens, batch))
                else:
                    stages.append(stage_run(model_dir, prompts, max_tokens, batch,
                                            root / f"stage{rep}"))
        base = min(bases, key=lambda r: r["seconds"])
        stage = min(stages, key=lambda r: r["seconds"])
        base["gen_only_tps"] = max(r["gen_only_tps"] for r in bases)
        stage["gen_only_tps"] = max(r["gen_only_tps"] for r in stages)
    same = sum(x == y for x, y in zip(base["outputs"], stage["outputs"]))
    b_tps = base["tokens"] / base["seconds"]
    s_tps = stage["tokens"] / stage["seconds"]
    print(f"generate bench: {n} prompts, {max_tokens} new tokens, batch {batch}, "
          f"{threads} torch threads, greedy, best of {a.repeat} runs each")
    print(f"{'run':<34}{'tokens':>8}{'seconds':>10}{'tokens/s':>11}")
    print(f"{'bare model.generate loop':<34}{base['tokens']:>8}{base['seconds']:>10.2f}"
          f"{b_tps:>11.1f}")
    print(f"{'generate stage (hf backend)':<34}{stage['tokens']:>8}{stage['seconds']:>10.2f}"
          f"{s_tps:>11.1f}")
    print(f"{'generation only: bare loop':<34}{'':>8}{'':>10}{base['gen_only_tps']:>11.1f}")
    print(f"{'generation only: stage':<34}{'':>8}{'':>10}{stage['gen_only_tps']:>11.1f}")
    print(f"identical greedy outputs: {same}/{n}")
    emit([result("generate", "tokens_per_s_end_to_end", s_tps, b_tps, 0.8),
          result("generate", "tokens_per_s_generation", stage["gen_only_tps"],
                 base["gen_only_tps"], 0.8)])

if __name__ == "__main__":
    main()
