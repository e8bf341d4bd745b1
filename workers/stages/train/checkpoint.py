"""Resumable checkpoints in `work_dir/checkpoints/step_<N>/`.

Each holds a loadable speculators checkpoint (`config.json` with `speculators_config` +
`model.safetensors`, written by `save_pretrained`, kept in float32 so a resume continues
exactly), `optimizer.pt` and `scheduler.pt` (lists, one entry per optimizer: Muon + AdamW),
`rng_<rank>.pt`, and `trainer_state.json` (step, data position, losses, the params
fingerprint). A checkpoint is written into `.tmp_step_<N>/` and renamed into place, so a
kill at any moment leaves either the whole checkpoint or none; the newest two are kept.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workers.stages.common import write_json_atomic

STATE_FILE = "trainer_state.json"
KEEP = 2
_STEP_DIR = re.compile(r"^step_(\d+)$")


def root(work_dir: str | Path) -> Path:
    return Path(work_dir) / "checkpoints"


def _steps(base: Path) -> list[tuple[int, Path]]:
    if not base.is_dir():
        return []
    found = []
    for d in base.iterdir():
        m = _STEP_DIR.match(d.name)
        if m and d.is_dir() and (d / STATE_FILE).is_file():
            found.append((int(m.group(1)), d))
    return sorted(found)


def clean_partial(work_dir: str | Path) -> None:
    """Drop half-written checkpoints left by a kill during a save."""
    base = root(work_dir)
    if base.is_dir():
        for d in base.iterdir():
            if d.name.startswith(".tmp_"):
                shutil.rmtree(d, ignore_errors=True)


def candidates(work_dir: str | Path) -> list[Path]:
    """Complete checkpoints, newest first (the caller falls back if one fails to load)."""
    return [d for _s, d in reversed(_steps(root(work_dir)))]


def tmp_dir(work_dir: str | Path, step: int) -> Path:
    d = root(work_dir) / f".tmp_step_{step}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # This rank's device only: touching every visible GPU would create a CUDA context
        # on each of them from each rank.
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def write_rng(tmp: Path, rank: int) -> None:
    torch.save(rng_state(), tmp / f"rng_{rank}.pt")


def _fsync_tree(d: Path) -> None:
    for p in d.iterdir():
        if p.is_file():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())


def finalize(work_dir: str | Path, step: int, raw_model, model_state: dict,
             optim_states: list[dict], sched_states: list[dict], state: dict) -> Path:
    """Rank 0: write the model/optimizer/scheduler/state files into the tmp dir (the rng
    files are already there) and rename it into place; prune old checkpoints."""
    tmp = tmp_dir(work_dir, step)
    raw_model.save_pretrained(tmp, state_dict=model_state)
    torch.save(optim_states, tmp / "optimizer.pt")
    torch.save(sched_states, tmp / "scheduler.pt")
    write_json_atomic(tmp / STATE_FILE, {**state, "step": step})
    _fsync_tree(tmp)
    final = root(work_dir) / f"step_{step}"
    if final.exists():  # a re-save of the same step (e.g. the final one after a resume)
        shutil.rmtree(final)
    os.replace(tmp, final)
    for _s, old in _steps(root(work_dir))[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read_state(ckpt: Path) -> dict:
    return json.loads((ckpt / STATE_FILE).read_text())


def load_model_weights(ckpt: Path, model) -> None:
    """Trained weights into a freshly built model (verifier-owned weights are not saved;
    they were already loaded from the target when the model was built)."""
    from safetensors.torch import load_file

    weights = load_file(str(ckpt / "model.safetensors"))
    missing_trainable = [n for n, p in model.named_parameters()
                         if p.requires_grad and n not in weights]
    if missing_trainable:
        raise ValueError(f"checkpoint {ckpt} lacks trained weights {missing_trainable[:5]}")
    model.load_state_dict(weights, strict=False)


def load_optim(ckpt: Path) -> tuple[list[dict], list[dict]]:
    optim = torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=False)
    sched = torch.load(ckpt / "scheduler.pt", map_location="cpu", weights_only=False)
    return optim, sched


def load_rng(ckpt: Path, rank: int) -> dict | None:
    f = ckpt / f"rng_{rank}.pt"
    return torch.load(f, weights_only=False) if f.is_file() else None
