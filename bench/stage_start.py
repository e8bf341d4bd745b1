"""Model stages forked warm vs started fresh (workers/stages/starter.py): the cost of a short run.

    python bench/stage_start.py              # 3 runs each way
    python bench/stage_start.py --runs 2

Two throwaway deployments (tests/service/stack.py, Redis DB 15), one with the worker's warm
starter (the default) and one with DRAFTYARD_STAGE_SERVER=false, each with one API and one
worker, the demo target and the same 48-record dataset. Each deployment runs `--runs` short
runs (generate, prepare, extract, train 4 steps, evaluate 4 prompts; `force`, so every stage
runs again) after one untimed run (the starter's start, the demo target's files in the page
cache). Per way: the median over runs of the summed wall time of the model stages' jobs
(generate, extract, train, evaluate: started_at to finished_at), and the CPU seconds the
worker's process tree spent per run (/proc, children included). Target: warm / fresh <= 0.6
for the stages' wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._common import emit, result  # noqa: E402

MODEL = ("generate", "extract", "train", "evaluate")


def _records(n: int) -> str:
    return "".join(json.dumps({"messages": [
        {"role": "user", "content": f"write a function number {i} that sums a list"},
        {"role": "assistant", "content": f"def f{i}(xs):\n    return sum(xs)\n"}]}) + "\n"
        for i in range(n))


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of `pid` and its reaped children (utime, stime, cutime, cstime) plus those
    of its live descendants, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    kids: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            f = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
        except OSError:
            continue
        stats[int(d)] = f
        kids.setdefault(int(f[1]), []).append(int(d))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        if p in stats:
            total += sum(int(x) for x in stats[p][11:15]) / tick
        todo += kids.get(p, [])
    return total


def _wall(job: dict) -> float:
    t0, t1 = (datetime.fromisoformat(job[k].replace("Z", "+00:00"))
              for k in ("started_at", "finished_at"))
    return (t1 - t0).total_seconds()


def measure(warm: bool, models: Path, data: Path, runs: int) -> tuple[list[float], list[float]]:
    from draftyard import Client
    from tests.service.stack import running

    with running("startbench", 15, {"DRAFTYARD_DATA_ROOTS": str(data),
                                    "DRAFTYARD_MODEL_ROOTS": str(models),
                                    "DRAFTYARD_CPU_SLOTS": "1",
                                    "DRAFTYARD_STAGE_SERVER": "true" if warm else "false"},
                 workers={"s1": None}) as stack:
        _api, worker = stack.procs
        c = Client(stack.url, stack.token, timeout=600)
        tgt = c.create_target("demo-target", str(models / "demo-target"))
        ds = c.wait_dataset(c.add_dataset("start-bench", str(data / "chat.jsonl"))["id"], 300)
        body = {"name": "start-bench", "target_id": tgt["id"], "dataset_id": ds["id"],
                "force": True, "evaluation": "in_sample",
                "drafter": {"type": "dflash", "num_layers": 1, "block_size": 4,
                            "draft_vocab_size": 512},
                "chat_template_kwargs": {"enable_thinking": False},
                "stages": {"generate": {"backend": "hf", "max_tokens": 8, "batch_size": 64},
                           "prepare": {"seq_length": 128},
                           "extract": {"dtype": "float32", "backend": "hf"},
                           "train": {"max_steps": 4, "seq_length": 128, "log_every": 2,
                                     "drafter": {"num_anchors": 8}},
                           "evaluate": {"num_prompts": 4, "max_new_tokens": 8}}}
        walls, cpus = [], []
        for i in range(runs + 1):
            cpu0 = _tree_cpu_s(worker.pid)
            run = c.create_run({**body, "name": f"start-bench-{i}"})
            done = c.wait_run(run["id"], timeout=900)
            if done["status"] != "succeeded":
                raise RuntimeError(f"run {i}: {done['status']}: {done.get('stages')}")
            jobs = [c.get_job(j["id"]) for j in done["jobs"] if j["run_stage"] in MODEL]
            if i:  # the first run is untimed
                walls.append(sum(_wall(j) for j in jobs))
                cpus.append(_tree_cpu_s(worker.pid) - cpu0)
        return walls, cpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    from workers.stages.demo_target import cached_demo_target

    tmp = Path(tempfile.mkdtemp(prefix="bench_start_"))
    try:
        models, data = tmp / "models", tmp / "data"
        data.mkdir(parents=True)
        shutil.copytree(cached_demo_target(), models / "demo-target")
        (data / "chat.jsonl").write_text(_records(48))
        warm = measure(True, models, data, a.runs)
        fresh = measure(False, models, data, a.runs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'model stages of a run':<24}{'wall s (median)':>16}{'worker CPU s (median)':>23}")
    for name, (w, c) in (("forked warm", warm), ("fresh process", fresh)):
        print(f"{name:<24}{statistics.median(w):>16.1f}{statistics.median(c):>23.1f}")
    ww, fw = statistics.median(warm[0]), statistics.median(fresh[0])
    wc, fc = statistics.median(warm[1]), statistics.median(fresh[1])
    print(f"warm / fresh: wall {ww / fw:.2f}, CPU {wc / fc:.2f}")
    emit([result("stage_start", "model_stages_wall_warm_vs_fresh_s", ww, fw, 0.6,
                 higher_is_better=False),
          result("stage_start", "worker_cpu_per_run_warm_vs_fresh_s", wc, fc, 0.8,
                 higher_is_better=False)])


if __name__ == "__main__":
    main()
