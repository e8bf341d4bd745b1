"""The seeds' scale, compute stages: how generate, prepare, extract, train and
evaluate grow with their records, on the tiny demo target on the CPU.

    python bench/scale_compute.py                    # N = 1K, 4K, 16K (16K: about an hour)
    python bench/scale_compute.py --sizes 1000,4000

Through the API as a user would (tests/service/stack.py: its own database, Redis DB 15, one
API and one worker with 2 CPU slots): the demo target (workers/stages/demo_target.py, the
per-machine cache) registered by path; at every N, N prompt-only code questions (the demo's
prompt shapes, 6-40 words) uploaded by path; then two runs of one body:

  offline  split (the default held-out share for evaluate) -> generate (HF, 16 new tokens,
           batch 64) -> prepare (seq 256) -> extract (HF, float32) -> train (1 epoch, seq
           256) -> evaluate (8 prompts, 16 new tokens)
  online   the same body with mode online: generate and prepare are reused from the offline
           run (the run's reuse rule), no extract, train computes the target's hidden states
           itself (HF, in-process)

Per stage and size: the job's wall time (started_at to finished_at), records/s, the peak RSS
of the stage's process tree (bench/_scale_measure.py), the bytes of the artifacts it wrote, the
database rows added while it ran (jobs, events, artifacts), and k, the growth exponent of
wall time (cost ~ N^k) from the previous size; the JSON line carries the least-squares k over
all sizes. evaluate's work is fixed (8 prompts), so its k says whether anything in it grows
with the training set. Targets: k <= 1.1 per stage; events per job bounded (<= 1 per second of
its wall + 20, besides its metric rows, which workers/supervisor.py spaces by elapsed time /
METRIC_EVENTS); peak RSS of generate and extract grows <= 1.25x over the sizes. And the
plan's estimate of each stage (`POST /v1/plans` of the same body at every N), calibrated by one
fixed start-up plus a factor per stage fitted at the smaller sizes, as a deployment
calibrates its DRAFTYARD_PLAN_RATES, against the measured wall at the largest (worst error,
target <= 25%).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._common import REDIS_DB  # noqa: E402
from bench._scale_measure import (TreeRss, db_counts, fmt_n, k_between, k_fit,  # noqa: E402
                                  print_table)
from bench.scale import _job_wall  # noqa: E402

STAGES = ("split", "generate", "prepare", "extract", "train", "evaluate")
VERBS = ("Write a function that", "Explain how to", "Show a Python class that",
         "Fix the bug in code that", "Write a test for a function that")
TASKS = ("parses a config file", "sorts a list of dicts by a key", "reads a CSV file",
         "merges two sorted lists", "counts words in a text", "retries a network call",
         "validates an email address", "flattens a nested list", "caches a slow function",
         "walks a directory tree")


def prompts(n: int, seed: int) -> str:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        extra = " ".join(" ".join(rng.choice(TASKS).split()[:rng.randint(1, 4)])
                         for _ in range(rng.randint(0, 6)))
        q = f"{rng.choice(VERBS)} {rng.choice(TASKS)}. {extra}".strip()
        out.append(json.dumps({"id": f"q{i}", "prompt": f"{q} (case {i})"}) + "\n")
    return "".join(out)


def body(target_id: str, ds_id: str, n: int, mode: str) -> dict:
    return {"name": f"compute-{n}-{mode}", "target_id": target_id, "dataset_id": ds_id,
            "mode": mode,
            "drafter": {"type": "dflash", "num_layers": 1, "block_size": 4,
                        "draft_vocab_size": 512},
            "chat_template_kwargs": {"enable_thinking": False},
            "stages": {"generate": {"backend": "hf", "max_tokens": 16, "batch_size": 64},
                       "prepare": {"seq_length": 256},
                       "extract": ({"dtype": "float32", "backend": "hf"}
                                   if mode == "offline" else None),
                       "train": {"epochs": 1, "seq_length": 256, "log_every": 10,
                                 "drafter": {"num_anchors": 16}},
                       "evaluate": {"num_prompts": 8, "max_new_tokens": 16}}}


class RunMeasure:
    """Follows a run's jobs; each stage's DB rows are the rows added while it ran."""

    def __init__(self, stack, client, rss: TreeRss):
        self.stack, self.c, self.rss = stack, client, rss

    def run(self, b: dict, n: int, mode: str) -> list[dict]:
        run = self.c.create_run(b)
        jobs = {j["run_stage"]: j for j in run["jobs"]}
        rows: list[dict] = []
        for stage in [s for s in STAGES if s in jobs]:
            before = db_counts(self.stack.engine())
            self.rss.reset()
            j = self.c.wait_job(jobs[stage]["id"], timeout=7200, poll=0.5)
            self.rss.sample()
            after = db_counts(self.stack.engine())
            if j["status"] != "succeeded":
                raise RuntimeError(f"{mode} {stage} at N={n}: {j['status']}: {j['error']}")
            reused = j.get("reused_from") is not None
            nbytes = sum(self.c.get_artifact(a)["bytes"] or 0 for a in j["outputs"] or [])
            evs = self.c.events(j["id"], limit=10_000)
            events = len(evs)
            metric_rows = sum(e["kind"] == "metric" for e in evs)
            rows.append({"stage": f"{stage}:{mode}" if stage in ("train", "evaluate") else stage,
                         "n": n, "wall_s": _job_wall(j) if not reused else 0.0,
                         "records": n, "rss_mb": self.rss.peak.get(stage, 0) / 1e6,
                         "bytes": nbytes, "events": events, "metric_rows": metric_rows,
                         "reused": reused,
                         "rows": {k: after[k] - before[k] for k in after}})
        done = self.c.wait_run(run["id"], timeout=600)
        if done["status"] != "succeeded":
            raise RuntimeError(f"{mode} run at N={n}: {done['status']}")
        return [r for r in rows if not r["reused"]]


WARMUP_N = 32
CPU_RATES = {"gpu": "bench: a 2-core CPU", "gpu_peak_tflops": 0.01,
             "prepare_tokens_per_s_per_core": 1e4}


def measure_size(c, m: RunMeasure, target_id: str, data_root: Path, n: int, seed: int,
                 earlier: list[dict]) -> list[dict]:
    """Both runs at N records: the new rows, k from the previous size's rows."""
    f = data_root / f"prompts-{n}.jsonl"
    f.write_text(prompts(n, seed))
    ds = c.wait_dataset(c.add_dataset(f"prompts-{n}", str(f))["id"], timeout=600)
    # The plan of each run body first, as a team would ask before running it: its per-stage
    # wall estimate goes beside what the stage then took (report(): estimate vs measured).
    est = {mode: {e["stage"]: e["wall_hours"] * 3600.0
                  for e in (c.plan(body(target_id, ds["id"], n, mode), timeout=600)
                            .get("time_estimates") or {}).get("stages", [])}
           for mode in ("offline", "online")}
    t0 = time.perf_counter()
    new = m.run(body(target_id, ds["id"], n, "offline"), n, "offline")
    new += m.run(body(target_id, ds["id"], n, "online"), n, "online")
    for r in new:
        stage, _, mode = r["stage"].partition(":")
        r["plan_s"] = est[mode or "offline"].get(stage)
    for r in new:
        prev = [x for x in earlier if x["stage"] == r["stage"]]
        if prev:
            r["k"] = k_between(prev[-1]["n"], prev[-1]["wall_s"], n, r["wall_s"])
    print(f"# N={fmt_n(n)}: both runs in {time.perf_counter() - t0:.0f} s", flush=True)
    print_table(new)
    print("# rows " + json.dumps(new, default=str), flush=True)
    return new


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000,4000,16000")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    sizes = [int(float(x)) for x in a.sizes.split(",") if x]

    from draftyard import Client
    from tests.service.stack import running
    from workers.stages.demo_target import cached_demo_target

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix="bench_compute_"))
    data_root, model_root = tmp / "data", tmp / "models"
    data_root.mkdir(parents=True)
    shutil.copytree(cached_demo_target(), model_root / "demo-target")
    settings = {"DRAFTYARD_CPU_SLOTS": "2", "DRAFTYARD_DATA_ROOTS": str(data_root),
                "DRAFTYARD_MODEL_ROOTS": str(model_root),
                # Rates of the order of this CPU's, so that the plan's estimates of a tiny
                # target are not rounded to 0.0000 h; plan_vs_measured calibrates them.
                "DRAFTYARD_PLAN_RATES": json.dumps(CPU_RATES)}
    rows: list[dict] = []
    try:
        with running("compute", REDIS_DB, settings, workers={"c1": None}) as stack:
            api, worker = stack.procs
            rss = TreeRss([api.pid, worker.pid]).start()
            try:
                c = Client(stack.url, stack.token, timeout=600)
                target = c.create_target("demo-target", str(model_root / "demo-target"))
                m = RunMeasure(stack, c, rss)
                # Untimed: the worker's first model stage waits for its warm starter
                # (workers/stages/starter.py, ~5-8 s here), a one-off that is not growth.
                measure_size(c, m, target["id"], data_root, WARMUP_N, a.seed, [])
                print(f"# (N={WARMUP_N} above: untimed warm-up)", flush=True)
                for n in sizes:
                    rows += measure_size(c, m, target["id"], data_root, n, a.seed, rows)
            finally:
                rss.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(rows, sizes)


def report(rows: list[dict], sizes: list[int]) -> None:
    print(f"\nall sizes ({', '.join(map(fmt_n, sizes))}):")
    print_table(rows)
    out = []
    for stage in dict.fromkeys(r["stage"] for r in rows):
        pts = [(r["n"], r["wall_s"]) for r in rows if r["stage"] == stage]
        k = k_fit(pts)
        out.append({"bench": "scale_compute", "metric": f"{stage}_time_growth_k",
                    "value": None if k is None else round(k, 3), "baseline": None,
                    "ratio": None, "target": 1.1, "pass": k is not None and k <= 1.1})
    for stage in ("generate", "extract"):
        rs = [r for r in rows if r["stage"] == stage]
        if len(rs) >= 2 and rs[0]["rss_mb"]:
            g = rs[-1]["rss_mb"] / rs[0]["rss_mb"]
            out.append({"bench": "scale_compute", "metric": f"{stage}_rss_growth",
                        "value": round(rs[-1]["rss_mb"], 1), "baseline": round(rs[0]["rss_mb"], 1),
                        "ratio": round(g, 3), "target": 1.25, "pass": g <= 1.25})
    out += plan_vs_measured(rows, sizes)
    # Metric rows (the loss curve) have their own bound: every one until the spacing grows
    # with the elapsed time (workers/supervisor.py METRIC_EVENTS); the rest, <= 1/s + 20.
    worst = max(r["events"] - r["metric_rows"] - (r["wall_s"] + 20) for r in rows) if rows \
        else 0
    out.append({"bench": "scale_compute", "metric": "events_per_job_over_bound",
                "value": worst, "baseline": 0, "ratio": None, "target": 0, "pass": worst <= 0})
    print(json.dumps(out))


def plan_vs_measured(rows: list[dict], sizes: list[int]) -> list[dict]:
    """The plan's estimates against the measured walls, as a team would use them: measure
    small runs, calibrate, plan the big one (DRAFTYARD_PLAN_RATES). Per stage, measured =
    fixed + factor x estimate, fitted on the smaller sizes (the factor alone with two sizes),
    predicts the largest; its error says whether the plan's cost model (linear in the records
    and tokens it names, constant for evaluate) predicts how the stage grows. `fixed` is what
    the plan does not model: a job's start-up and model load, seconds, which only a tiny job
    notices."""
    if len(sizes) < 2:
        return []
    fit_at = sizes[:-1] if len(sizes) >= 3 else sizes[:1]
    print(f"\nplan vs measured (fitted at {', '.join(map(fmt_n, fit_at))}; "
          f"predicted = fixed + factor x plan):")
    print(f"{'stage':<18} {'N':>5} {'plan s':>10} {'fixed s':>8} {'predicted s':>12} "
          f"{'measured s':>11} {'error':>7}")
    worst = 0.0
    for stage in dict.fromkeys(r["stage"] for r in rows):
        pts = [r for r in rows if r["stage"] == stage and r.get("plan_s")]
        fit = [r for r in pts if r["n"] in fit_at]
        if not fit or len(pts) < 2:
            continue
        xs, ys = [r["plan_s"] for r in fit], [r["wall_s"] for r in fit]
        if len(fit) >= 2 and max(xs) > min(xs) * 1.01:
            factor, fixed = (float(v) for v in np.polyfit(xs, ys, 1))
            fixed = max(fixed, 0.0)
            if fixed == 0.0:
                factor = sum(ys) / sum(xs)
        else:  # one size, or a constant estimate (evaluate): the factor alone
            factor, fixed = sum(ys) / sum(xs), 0.0
        for r in pts:
            pred = fixed + factor * r["plan_s"]
            err = (pred - r["wall_s"]) / r["wall_s"]
            if r["n"] == sizes[-1]:
                worst = max(worst, abs(err))
            print(f"{stage:<18} {fmt_n(r['n']):>5} {r['plan_s']:>10.4g} {fixed:>8.1f} "
                  f"{pred:>12.1f} {r['wall_s']:>11.1f} {err:>+7.0%}"
                  f"{'' if r['n'] in fit_at else '  <- predicted'}")
    return [{"bench": "scale_compute", "metric": f"plan_estimate_error_{fmt_n(sizes[-1])}",
             "value": round(worst, 3), "baseline": None, "ratio": None, "target": 0.25,
             "pass": worst <= 0.25, "fitted_at": fit_at}]


if __name__ == "__main__":
    main()
