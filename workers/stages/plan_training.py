"""The plan's training estimate: how many optimizer steps the run's train stage
will take, from the records it trains on, the tokens packed per step, the epochs and
max_steps, and a warning when max_steps cannot be reached (`max_steps: 30` with one epoch of
three packed batches trained 3 steps and said nothing).

A step is one packed batch per process: speculators' multipack sampler fills each batch
with whole records up to `seq_length` tokens (train/data.py), so a batch holds
`seq_length // length` records of a given length, never a record split in two. The estimate
packs the plan's sampled lengths the same way (first fit, longest first, each capped at
seq_length) and scales to the records train will see: the dataset minus the held-out
records (contracts/split.py) and minus `val_fraction`.
"""

from __future__ import annotations

import math
from typing import Any

from contracts.split import SplitParams, held_out_count


def _bins(lengths: list[int], capacity: int) -> int:
    free: list[int] = []
    for n in sorted((min(x, capacity) for x in lengths), reverse=True):
        for i, room in enumerate(free):
            if room >= n:
                free[i] -= n
                break
        else:
            free.append(capacity - n)
    return len(free)


def estimate_training(parsed: dict[str, Any], lengths: list[int], records: int,
                      warnings: list[str]) -> dict[str, Any] | None:
    """The `training` estimate of the plan, or None when there is no train stage or no
    sampled record; appends the warnings it finds to `warnings`."""
    train = parsed.get("train")
    if train is None or not lengths or not records:
        return None
    split = parsed.get("split")
    held = held_out_count(records, split if isinstance(split, SplitParams) else SplitParams()) \
        if "split" in parsed else 0
    n = max(0, int((records - held) * (1 - train.val_fraction)))
    procs = train.nproc or 1
    per_epoch = max(1, math.ceil(_bins(lengths, train.seq_length) * n / len(lengths) / procs))
    from_epochs = per_epoch * train.epochs
    steps = min(from_epochs, train.max_steps) if train.max_steps else from_epochs
    out = {"records": n, "held_out": held, "tokens_per_step": train.seq_length * procs,
           "processes": procs, "steps_per_epoch": per_epoch, "epochs": train.epochs,
           "max_steps": train.max_steps, "steps": steps,
           "epochs_run": round(steps / per_epoch, 2)}
    if train.max_steps and train.max_steps > from_epochs:
        need = math.ceil(train.max_steps / per_epoch)
        warnings.append(
            f"stages.train.max_steps {train.max_steps} cannot be reached: {train.epochs} "
            f"epoch(s) of ~{per_epoch} packed batch(es) ({n} records, {train.seq_length} "
            f"tokens per step) give {from_epochs} step(s); set stages.train.epochs to {need} "
            f"or more, or lower max_steps")
    return out
