"""`draftyard real-target`: SmolLM2-135M-Instruct and real prompts (ShareGPT, HumanEval).

The conversion and the prompt files are made by `python -m workers.stages.real_target` in a
child process (app/ never imports torch; workers/stages/real_target.py says what it does and
where the cache lies). `--register` then tells a running server about them through the API:
the target by its cached folder (which must lie inside the server's DRAFTYARD_MODEL_ROOTS),
the prompt files as uploads.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from app.cli.view import console
from draftyard import Client
from procgroup import spawn

REPO = Path(__file__).resolve().parents[2]
TARGET_NAME = "smollm2-135m-instruct"
# SmolLM2's ChatML template has no thinking mode: nothing to pass.
CHAT_KWARGS: dict = {}


def prepare(prompts_dir: Path | None = None, log=console.print) -> tuple[Path, dict | None]:
    """(the converted model's folder, the prompt files' counts or None), made once per
    machine by the stage module (the first time a few minutes: install, convert, verify)."""
    argv = [sys.executable, "-m", "workers.stages.real_target", "--cached"]
    if prompts_dir is not None:
        argv += ["--prompts", str(prompts_dir)]
    t0 = time.time()
    log("real target: SmolLM2-135M-Instruct, converted once per machine from its GGUF file...")
    proc = spawn(argv, cwd=REPO, stdout=subprocess.PIPE, text=True,
                 env={**os.environ, "PYTHONPATH": str(REPO)}, death_signal=signal.SIGTERM)
    assert proc.stdout is not None
    lines = [line.rstrip("\n") for line in proc.stdout]
    if proc.wait() != 0 or not lines:
        raise RuntimeError(f"preparing the real target failed (exit {proc.returncode}): "
                           + " | ".join(lines[-5:]))
    counts = None
    for line in lines:
        if line.startswith("{"):
            counts = json.loads(line)
        elif line != lines[-1]:
            log(f"  {line}")
    folder = Path(lines[-1])
    log(f"real target: {folder} ready in {time.time() - t0:.0f} s")
    if counts is not None:
        sg = counts["sharegpt"]
        log(f"ShareGPT (cut-off file): {sg['records']} whole records kept, {sg['dropped']} cut "
            f"record dropped ({sg['dropped_bytes']} bytes); {sg['prompts']} prompts written, "
            f"{sg['no_prompt']} records without an opening user turn -> {sg['path']}")
        log(f"HumanEval: {counts['humaneval']['prompts']} prompts -> "
            f"{counts['humaneval']['path']}")
    return folder, counts


def register(c: Client, folder: Path, counts: dict | None, name: str = TARGET_NAME,
             log=console.print) -> dict:
    """Register the target (and upload the prompt files); returns their ids."""
    tgt = c.create_target(name, str(folder), chat_template_kwargs=CHAT_KWARGS)
    log(f"registered target {tgt['id']}: {tgt['architecture']}, hidden {tgt['hidden_size']}, "
        f"{tgt['num_layers']} layers, vocab {tgt['vocab_size']}")
    out: dict = {"target_id": tgt["id"]}
    for key in ("sharegpt", "humaneval"):
        if counts is None:
            break
        d = c.wait_dataset(c.upload_dataset(counts[key]["path"], f"{key}-prompts")["id"], 600)
        log(f"dataset {d['id']} {key}-prompts: {d['num_records']} prompt-only records, "
            f"{d['num_rejected']} rejected ({d['status']})")
        out[f"{key}_dataset_id"] = d["id"]
    return out
