"""Plan latency: warm plan server vs a fresh process per plan (app/plans/service.py).

    python bench/plan.py                 # 8 plans each way
    python bench/plan.py --plans 4

Two throwaway deployments (tests/service/stack.py, Redis DB 15), one with the plan server
(the default) and one with DRAFTYARD_PLAN_SERVER=false, each with one API and one worker; the
same target (a tiny Qwen3 carrying the real Qwen3 tokenizer, 151,669 tokens: what a real
target's plan loads) and the same 200-record dataset. `POST /v1/plans` of one run body,
`--plans` times each, after one untimed plan (the server's start, the tokenizer-class memo).
Reports the median round trip of each and their ratio (warm / fresh; target <= 0.5).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._common import emit, result  # noqa: E402
from tests.service.stack import running  # noqa: E402


def _records(n: int) -> str:
    return "".join(json.dumps({"messages": [
        {"role": "user", "content": f"write a function number {i} that sums a list"},
        {"role": "assistant", "content": f"def f{i}(xs):\n    return sum(xs)\n"}]}) + "\n"
        for i in range(n))


def measure(server: bool, models: Path, data: Path, plans: int) -> list[float]:
    from draftyard import Client

    with running("planbench", 15, {"DRAFTYARD_DATA_ROOTS": str(data),
                                   "DRAFTYARD_MODEL_ROOTS": str(models),
                                   "DRAFTYARD_PLAN_SERVER": "true" if server else "false"},
                 workers={"p1": None}) as stack:
        c = Client(stack.url, stack.token, timeout=600)
        tgt = c.create_target("tiny-qwen3", str(models / "tiny"))
        ds = c.wait_dataset(c.add_dataset("plan-bench", str(data / "chat.jsonl"))["id"], 300)
        body = {"name": "plan-bench", "target_id": tgt["id"], "dataset_id": ds["id"],
                "drafter": {"type": "dflash", "num_layers": 1, "block_size": 4},
                "chat_template_kwargs": {"enable_thinking": False},
                "stages": {"prepare": {"seq_length": 512}, "train": {"max_steps": 10}}}
        c.plan(body)  # untimed: starts the server, remembers the tokenizer class
        walls = []
        for _ in range(plans):
            t0 = time.perf_counter()
            plan = c.plan(body)
            walls.append(time.perf_counter() - t0)
            assert plan["checks"], plan
        return walls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plans", type=int, default=8)
    a = ap.parse_args()
    from workers.stages.tinymodel import build_tiny_target

    tmp = Path(tempfile.mkdtemp(prefix="bench_plan_"))
    try:
        models, data = tmp / "models", tmp / "data"
        data.mkdir(parents=True)
        build_tiny_target(models / "tiny", arch="qwen3")
        (data / "chat.jsonl").write_text(_records(200))
        warm = measure(True, models, data, a.plans)
        fresh = measure(False, models, data, a.plans)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    w, f = statistics.median(warm), statistics.median(fresh)
    print(f"{'plan':<22}{'median s':>10}{'min s':>8}{'max s':>8}")
    for name, xs in (("warm plan server", warm), ("fresh process", fresh)):
        print(f"{name:<22}{statistics.median(xs):>10.2f}{min(xs):>8.2f}{max(xs):>8.2f}")
    print(f"warm / fresh: {w / f:.2f}")
    emit(result("plan", "plan_round_trip_warm_vs_fresh_s", w, f, 0.5, higher_is_better=False))


if __name__ == "__main__":
    main()
