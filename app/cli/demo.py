"""`draftyard demo`: the whole product on a laptop, through the HTTP API.

Builds a tiny Qwen3-architecture target (real Qwen3 tokenizer, briefly trained on Python's
own sources so its output is varied), starts the embedded service, ingests the bundled
samples in several formats (prompt-only records included), mixes them, plans, submits a
DFlash run (generate -> prepare -> extract -> train -> evaluate), follows every stage with
a progress bar, and prints the acceptance report: the trained drafter against the untrained
one, and where every artifact is.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from app.cli.report import print_report as show_report
from app.cli.runs import print_plan
from app.cli.view import console, follow_jobs
from contracts.drafters import DEFAULT_DRAFTER
from draftyard import ApiError, Client
from procgroup import spawn

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "demo" / "data"

# docs/FIELD-NOTES.md "The whole pipeline fits a laptop demo": the settings that gave tau 5.2.
# 16 of the 32 held-out prompts: half the evaluate stage's time (5 decoding passes), still
# ~340 decoding steps of the trained drafter. Measured 2026-12-06 from an empty home and cache:
# tau 4.50 vs 1.00 untrained on 16 prompts (5.11 on all 32 with the stages on 1 thread), 221 s.
FULL: dict[str, Any] = dict(target_steps=600, per_source=None, max_tokens=96, epochs=12, eval_prompts=16,
            max_steps=None)
# --quick (the test suite's variant): every stage runs, each as briefly as still says something.
# Its target is the full demo's (and the stage tests'): one build per machine serves all three,
# where a 150-step target of its own cost a fresh machine's first `make test` another ~3 min.
QUICK: dict[str, Any] = dict(target_steps=600, per_source=8, max_tokens=32, epochs=2, eval_prompts=2,
                              max_steps=None)


def _build_target(models: Path, steps: int) -> Path:
    """The demo target in the demo's model root: copied from the per-machine cache
    ($DRAFTYARD_CACHE, ~/.cache/draftyard), which builds it the first time (the build is
    deterministic, so every later demo, whatever its DRAFTYARD_HOME, reuses it)."""
    out = models / f"demo-target-{steps}"
    if (out / "config.json").exists() and (out / "demo_target.json").exists():
        console.print(f"target: reusing {out}")
        return out
    console.print(f"target: a tiny Qwen3 ({steps} training steps on the stdlib), built once per "
                  "machine...")
    t = time.time()
    proc = spawn([sys.executable, "-m", "workers.stages.demo_target", "--cached", "--steps",
                  str(steps)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                 env={**os.environ, "PYTHONPATH": str(REPO)}, death_signal=signal.SIGTERM)
    last = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        if last:
            console.print(f"  {last}")
        last = line.strip()
    if proc.wait() != 0:
        raise RuntimeError(f"building the demo target failed (exit {proc.returncode})")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(last, tmp)
    tmp.rename(out)
    console.print(f"target: ready in {time.time() - t:.0f} s at {out} (cache: {last})")
    return out


def ingest_data(c: Client, cfg: dict, log=console.print) -> tuple[dict, dict]:
    """The bundled samples ingested and mixed, and the held-out prompts: (mix, held). Needs
    no target, so it runs while the target builds."""
    sources = []
    for f, name in (("prompts.jsonl", "demo-prompts"), ("alpaca.jsonl", "demo-alpaca"),
                    ("sharegpt.jsonl", "demo-sharegpt")):
        d = c.wait_dataset(c.upload_dataset(DATA / f, name)["id"], 300)
        log(f"ingested {name}: format {d['format']}, {d['num_records']} records "
            f"({d['stats'].get('user_only', 0)} prompt-only), {d['num_rejected']} rejected")
        sources.append({"dataset_id": d["id"], **({"max_records": cfg["per_source"]}
                                                  if cfg["per_source"] else {})})
    mix = c.wait_dataset(c.mix_datasets("demo-mix", sources, dedupe=True, seed=0)["id"], 300)
    held = c.wait_dataset(c.add_dataset("demo-heldout", DATA / "heldout.jsonl")["id"], 300)
    log(f"mixed {mix['num_records']} training records; {held['num_records']} held-out prompts")
    return mix, held


def run_pipeline(c: Client, target_dir: Path, data: tuple[dict, dict], cfg: dict,
                 log=console.print) -> dict:
    """Register the target, plan and run on the ingested `data` (ingest_data). Returns the
    final run object."""
    mix, held = data
    tgt = c.create_target("demo-target", str(target_dir), chat_template_kwargs={})
    log(f"registered target {tgt['id']}: {tgt['architecture']}, hidden {tgt['hidden_size']}, "
        f"{tgt['num_layers']} layers, vocab {tgt['vocab_size']}")
    body = {
        "name": "demo-dflash", "target_id": tgt["id"], "dataset_id": mix["id"],
        # docs/FIELD-NOTES.md's demo drafter (DFlash, the default type): aux layers 1, 4, 7
        # of the 8. The DFlash default for this depth (z-lab's spacing, 2-6) leaves out the
        # deepest layer: tau 2.43 instead of 3.97 on the same data (measured with make demo).
        "drafter": {"type": DEFAULT_DRAFTER, "num_layers": 1, "block_size": 8,
                    "draft_vocab_size": 2048, "target_layer_ids": [1, 4, 7]},
        "mode": "offline", "chat_template_kwargs": {"enable_thinking": False},
        "stages": {
            "generate": {"max_tokens": cfg["max_tokens"], "temperature": 0.0, "backend": "hf",
                         "batch_size": 64},
            "prepare": {"seq_length": 1024},
            "extract": {"dtype": "float32", "backend": "hf"},
            "train": {"lr": 1e-2, "epochs": cfg["epochs"], "seq_length": 1024,
                      "drafter": {"num_anchors": 128},
                      **({"max_steps": cfg["max_steps"]} if cfg["max_steps"] else {})},
            "evaluate": {"data": held["id"], "num_prompts": cfg["eval_prompts"],
                         "max_new_tokens": cfg["max_tokens"], "baseline": "untrained"},
        },
    }
    t = time.time()
    plan = c.plan(body)
    print_plan(plan, time.time() - t, log)
    run = c.create_run(body)
    log(f"submitted run {run['id']} with {len(run['jobs'])} stages")
    labels = {j["id"]: j["run_stage"] for j in run["jobs"]}
    follow_jobs(c, list(labels), labels)
    return c.get_run(run["id"])


def print_report(c: Client, run: dict) -> dict:
    """The run's report as `draftyard runs show` prints it, then where each artifact lies."""
    console.print(f"\nacceptance report of run {run['id']} (also: draftyard runs show "
                  f"{run['id']}, or the dashboard's run page)")
    show_report(c.run_report(run["id"]))
    artifacts = {}
    for j in run["jobs"]:
        for a in j["outputs"]:
            art = c.get_artifact(a)
            artifacts[j["run_stage"]] = {"id": a, "kind": art["kind"], "uri": art["uri"]}
            console.print(f"  {art['kind']:<14} {a} {art['uri']}")
    return artifacts


def run_demo(json_out: bool = False, quick: bool = False, keep: bool = False) -> int:
    from app.cli.embedded import start_embedded, stop
    from app.core.config import get_settings

    cfg = QUICK if quick else FULL
    s = get_settings()
    models = s.home / "models"
    models.mkdir(parents=True, exist_ok=True)
    os.environ["DRAFTYARD_MODEL_ROOTS"] = str(models)
    os.environ["DRAFTYARD_DATA_ROOTS"] = str(DATA)
    # The demo's stages run one after another (each needs the last one's output): one CPU
    # slot gives each stage all the cores (workers/stages/threads.py), where the default two
    # slots would leave half of them idle for the whole run.
    os.environ.setdefault("DRAFTYARD_CPU_SLOTS", "1")
    # Its plan comes seconds after the service is up: the plan server starts with it.
    os.environ.setdefault("DRAFTYARD_PLAN_WARM_UP", "1")
    t0 = time.time()
    # The target builds while the service starts and ingests the data, which need no target,
    # on a thread that waits for the build's process (procgroup.spawn ties a child to the
    # thread that started it); `building.result()` re-raises a failed build.
    pool = ThreadPoolExecutor(1, thread_name_prefix="demo-target-build")
    building = pool.submit(_build_target, models, cfg["target_steps"])
    port = int(os.environ.get("DRAFTYARD_DEMO_PORT", "8765"))
    try:
        proc = start_embedded(port)
    except BaseException:
        pool.shutdown()  # waits for the build
        raise
    try:
        c = Client(f"http://127.0.0.1:{port}", (s.home / "admin_token").read_text().strip(),
                   timeout=180)
        console.print(f"dashboard: http://127.0.0.1:{port}/ui (token in {s.home / 'admin_token'})")
        data = ingest_data(c, cfg)
        run = run_pipeline(c, building.result(), data, cfg)
        artifacts = print_report(c, run)
        rep = run.get("report") or {}
        console.print(f"\ndemo finished in {time.time() - t0:.0f} s; home {s.home}")
        if json_out:
            print(json.dumps({"run_id": run["id"], "status": run["status"],
                              "tau": rep.get("tau"), "tau_baseline": rep.get("tau_baseline"),
                              "tau_sim": rep.get("tau_sim"),
                              "artifacts": {k: v["id"] for k, v in artifacts.items()},
                              "seconds": round(time.time() - t0, 1)}))
        if keep:
            console.print(f"service left running on http://127.0.0.1:{port}, dashboard at /ui "
                          "(Ctrl-C to stop)")
            proc.wait()
        return 0 if run["status"] == "succeeded" else 1
    except ApiError as e:
        console.print(f"[red]demo failed[/red]: {e}")
        if json_out:
            print(json.dumps({"status": "error", "error": str(e)}))
        return 1
    finally:
        if not keep:
            stop(proc)
        pool.shutdown()  # waits for the build
