"""bench/scale.py's second part: the GPU stages (generate, extract, train, evaluate, with the
run's split and prepare) on the tiny demo target, on CPU, at M prompt-only records, offline and
online, through `POST /v1/runs`; and the plan's estimates for the same run against the
measured times.

The demo target (workers/stages/demo_target.py, cached per machine) is registered from its
cache folder (added to the stack's model roots). The records are CodeAlpaca-shaped prompts
from bench/_scale_data.py. The run is the demo's quick one (answers of `max_tokens` 32,
prepare at seq 1024, 1 epoch, evaluate on 8 held-out prompts), so growth with M is measured,
not quality. The stack's DRAFTYARD_PLAN_RATES describe this CPU as if it were the GPU
(`CPU_RATES`, calibrated once on this machine, stated in the table), so the plan's estimate
and the measured wall can be set side by side."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import orjson

from bench._scale_data import Gen
from bench._scale_measure import db_counts

# This 2-core box as the plan's "GPU": fp32 torch on one core reaches ~20 GFLOPS on the tiny
# target's matmuls; HF generate decodes ~150 tokens/s at batch 64; prepare ~100K tokens/s.
CPU_RATES = {"gpu": "this machine's CPU (fp32 torch, 1 thread)", "gpu_peak_tflops": 0.02,
             "prefill_mfu": 0.5, "train_mfu": 0.3, "decode_tokens_per_s_per_gpu": 150.0,
             "eval_tokens_per_s_per_gpu": 40.0, "prepare_tokens_per_s": 100_000.0,
             "default_gpus": 1}
STAGES = ("split", "generate", "prepare", "extract", "train", "evaluate")


def demo_target_dir() -> Path:
    out = subprocess.run([sys.executable, "-m", "workers.stages.demo_target", "--cached"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip().splitlines()[-1])


def write_prompts(path: Path, m: int, seed: int) -> None:
    g = Gen(seed + 1000 + m)
    with open(path, "wb") as f:
        for _ in range(m):
            f.write(orjson.dumps({"instruction": g.text(75, 0.6), "input": "",
                                  "output": g.text(190, 0.9)}) + b"\n")


def run_body(target_id: str, ds_id: str, mode: str) -> dict:
    return {"name": f"scale-{mode}", "target_id": target_id, "dataset_id": ds_id,
            "drafter": {"type": "dflash", "num_layers": 1, "block_size": 8,
                        "draft_vocab_size": 2048, "target_layer_ids": [1, 4, 7]},
            "mode": mode, "chat_template_kwargs": {"enable_thinking": False},
            "stages": {"generate": {"max_tokens": 32, "temperature": 0.0, "backend": "hf",
                                    "batch_size": 64},
                       "prepare": {"seq_length": 1024},
                       "extract": {"dtype": "float32", "backend": "hf"} if mode == "offline"
                       else None,
                       "train": {"lr": 1e-2, "epochs": 1, "seq_length": 1024,
                                 "drafter": {"num_anchors": 128}},
                       "evaluate": {"num_prompts": 8, "max_new_tokens": 32}}}


def _ts(s):
    from datetime import datetime

    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp() if s else 0.0


def measure_runs(bench, target_id: str, data_root: Path, sizes: list[int], seed: int
                 ) -> list[dict]:
    """One row per (stage, mode, M), as bench/scale.py's rows, plus the plan's estimate."""
    c, rows = bench.c, []
    for m in sizes:
        src = data_root / f"prompts-{m}.jsonl"
        write_prompts(src, m, seed)
        ds = c.wait_dataset(c.add_dataset(f"prompts-{m}", str(src))["id"], timeout=3600)
        for mode in ("offline", "online"):
            body = run_body(target_id, ds["id"], mode)
            plan = c.plan(body, timeout=600)
            est = {s["stage"]: s for s in plan.get("time_estimates", {}).get("stages", [])}
            before = db_counts(bench.stack.engine())
            bench.rss.reset()
            run = c.create_run(body)
            run = c.wait_run(run["id"], timeout=6 * 3600, poll=2.0)
            bench.rss.sample()
            after = db_counts(bench.stack.engine())
            if run["status"] != "succeeded":
                raise RuntimeError(f"run {mode} M={m} {run['status']}: " + str(
                    [(j["run_stage"], j["status"], j["error"]) for j in run["jobs"]]))
            for j in run["jobs"]:
                stage = j["run_stage"]
                evs = len(c.events(j["id"], limit=10000))
                wall = _ts(j["finished_at"]) - _ts(j["started_at"])
                e = est.get(stage)
                rows.append({"stage": f"{stage}/{mode[:3]}", "n": m, "wall_s": wall,
                             "records": m, "rss_mb": bench.rss.peak.get(j["type"], 0) / 1e6,
                             "bytes": bench.art_bytes(j["outputs"]),
                             "rows": {"jobs": 1, "job_events": evs,
                                      "artifacts": len(j["outputs"])},
                             "estimate_s": e["wall_hours"] * 3600 if e else None})
            rows[-1]["run_rows"] = {k: after[k] - before[k] for k in after}
            time.sleep(0.1)
    return rows


def print_estimates(rows: list[dict]) -> None:
    print(f"\nplan estimate vs measured (rates {CPU_RATES})")
    print(f"{'stage':<16}{'M':>7}{'estimate s':>12}{'measured s':>12}{'ratio':>8}")
    for r in rows:
        if r.get("estimate_s"):
            print(f"{r['stage']:<16}{r['n']:>7}{r['estimate_s']:>12.1f}{r['wall_s']:>12.1f}"
                  f"{r['estimate_s'] / r['wall_s']:>8.2f}")
