"""The seeds' run, planned as a new user would.

    python bench/seeds_plan.py               # 800,000 prompt-only records
    python bench/seeds_plan.py --records 20000

A throwaway deployment (tests/service/stack.py, Redis DB 15, one API and one worker). A target
registered from a config with Qwen3.6-27B's shapes (hidden 5120, 64 layers, three
gated-delta-net layers per full-attention one, vocab 248,320) and the Qwen3 tokenizer, no
weights; `--records` prompt-only records uploaded by path and ingested; then `POST /v1/plans`
of the seeds' run on 8 GPUs (generate answers of up to 2048 tokens, prepare at seq 4096,
train 1 epoch, evaluate on 64 prompts), offline and online, and `POST /v1/runs` of the online
one, which is refused (422) because the target has no weights. Prints the plans' time
estimates per stage; the last line is the JSON result: the online plan's total wall hours
(informational, no target) and whether the run was refused as it should be.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._common import REDIS_DB  # noqa: E402

from tests.service.stack import Stack  # noqa: E402
from tests.stages.test_plan_time import SEEDS_CONFIG  # noqa: E402

WORDS = "write a function that returns the sum of list python explain why how does".split()


def body(target_id: str, ds_id: str, mode: str) -> dict:
    return {"name": f"seeds-{mode}", "target_id": target_id, "dataset_id": ds_id,
            "drafter": {"type": "dflash", "num_layers": 1, "block_size": 16},
            "chat_template_kwargs": {"enable_thinking": False}, "mode": mode,
            "stages": {"generate": {"max_tokens": 2048, "gpus": 8},
                       "prepare": {"seq_length": 4096},
                       "extract": {"gpus": 8} if mode == "offline" else None,
                       "train": {"seq_length": 4096, "epochs": 1, "gpus": 8},
                       "evaluate": {"num_prompts": 64, "max_new_tokens": 256, "gpus": 1}}}


def show(name: str, plan: dict) -> None:
    t = plan["time_estimates"]
    print(f"\n{name}: ok={plan['ok']}; failing checks: " + "; ".join(
        f"{c['name']}: {c['message']}" for c in plan["checks"] if not c["ok"]))
    print(f"{'stage':<10}{'GPUs':>5}{'GPU-hours':>12}{'wall hours':>12}{'disk GB':>12}"
          f"{'tokens':>16}  basis")
    for s in t["stages"]:
        print(f"{s['stage']:<10}{s['gpus']:>5}{s['gpu_hours']:>12,.1f}{s['wall_hours']:>12,.1f}"
              f"{s['disk_bytes'] / 1e9:>12,.1f}{s['tokens']:>16,}  {s['basis']}")
    print(f"{'total':<10}{'':>5}{t['total_gpu_hours']:>12,.1f}{t['total_wall_hours']:>12,.1f}"
          f"{t['total_disk_bytes'] / 1e9:>12,.1f}")
    print("rates: " + json.dumps(t["rates"]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=800_000)
    a = ap.parse_args()
    from draftyard import Client
    from draftyard.errors import ApiError
    from workers.stages.tinymodel import qwen3_tokenizer_dir

    tmp = Path(tempfile.mkdtemp(prefix="bench_seeds_"))
    data, models = tmp / "data", tmp / "models"
    data.mkdir()
    shutil.copytree(qwen3_tokenizer_dir(), models / "qwen3.6-27b-shape")
    (models / "qwen3.6-27b-shape" / "config.json").write_text(json.dumps(SEEDS_CONFIG))
    rng = random.Random(0)
    with open(data / "prompts.jsonl", "w") as f:
        for i in range(a.records):
            f.write(json.dumps({"prompt": " ".join(rng.choice(WORDS) for _ in
                                                   range(rng.randint(8, 120))) + f" ({i})"}) + "\n")
    stack = Stack("seeds", REDIS_DB, {"DRAFTYARD_DATA_ROOTS": str(data),
                                "DRAFTYARD_MODEL_ROOTS": str(models)})
    out = {}
    try:
        stack.create()
        stack.start_api()
        stack.start_worker("s1")
        c = Client(stack.url, stack.token, timeout=600)
        tgt = c.create_target("qwen3.6-27b-shape", str(models / "qwen3.6-27b-shape"))
        t0 = time.perf_counter()
        ds = c.wait_dataset(c.add_dataset("seeds-prompts", str(data / "prompts.jsonl"))["id"],
                            timeout=3600)
        print(f"target {tgt['id']}: {tgt['architecture']} hidden {tgt['hidden_size']}, "
              f"{tgt['num_layers']} layers, vocab {tgt['vocab_size']}; dataset "
              f"{ds['num_records']:,} records ingested in {time.perf_counter() - t0:.1f} s")
        for mode in ("offline", "online"):
            t0 = time.perf_counter()
            for attempt in range(3):  # on a loaded box the plan child's imports alone can
                try:              # pass the API's 120 s limit (503 plan_timeout)
                    plan = c.plan(body(tgt["id"], ds["id"], mode), timeout=600)
                    break
                except ApiError as e:
                    if e.code != "plan_timeout" or attempt == 2:
                        raise
                    print(f"plan {mode}: {e.message}; again")
            print(f"plan {mode} answered in {time.perf_counter() - t0:.1f} s")
            show(f"plan {mode}", plan)
            out[mode] = plan
        try:
            c.create_run(body(tgt["id"], ds["id"], "online"))
            refused = None
        except ApiError as e:
            refused = (e.status, e.code, e.message[:400])
        print(f"\nPOST /v1/runs online: {refused}")
    finally:
        stack.close()
        shutil.rmtree(tmp, ignore_errors=True)
    t = out["online"]["time_estimates"]
    print(json.dumps({"bench": "seeds_plan", "metric": "online_total_wall_hours",
                      "value": t["total_wall_hours"], "baseline": None, "ratio": None,
                      "target": None, "pass": bool(refused and refused[0] == 422),
                      "gpu_hours": t["total_gpu_hours"], "loadavg": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
