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


# Below this share of trained tokens in the draft vocabulary, a drafter cannot propose the
# rest at all (docs/FIELD-NOTES.md: a draft vocabulary missing the answers' tokens gave tau
# exactly 1.00).
MIN_VOCAB_COVERAGE = 0.95


def vocab_coverage(trained: list[list[int]], draft_vocab: int | None,
                   warnings: list[str]) -> dict[str, Any] | None:
    """Share of the sampled records' trained tokens inside a draft vocabulary of the
    `draft_vocab` most frequent of them (as prepare picks it), on the records themselves and
    on held-out ones (the vocabulary from the first half, measured on the second: what an
    evaluation on unseen prompts meets). None without a draft vocabulary or tokens."""
    from collections import Counter

    if not draft_vocab or sum(map(len, trained)) == 0:
        return None

    def cover(vocab_from: list[list[int]], on: list[list[int]]) -> float | None:
        top = {t for t, _ in Counter(t for r in vocab_from for t in r).most_common(draft_vocab)}
        n = sum(map(len, on))
        return round(sum(t in top for r in on for t in r) / n, 4) if n else None

    half = len(trained) // 2
    out = {"draft_vocab_size": draft_vocab, "training": cover(trained, trained),
           "held_out": cover(trained[:half], trained[half:]) if half else None}
    # A half-sample with fewer distinct tokens than the vocabulary says the sample is small,
    # not that the vocabulary is: its held-out share is reported, not warned about.
    filled = len({t for r in trained[:half] for t in r}) >= draft_vocab
    shares = {k: v for k in ("training", "held_out")
              if isinstance(v := out[k], float) and (k == "training" or filled)}
    low = [f"{k} {v:.1%}" for k, v in shares.items() if v < MIN_VOCAB_COVERAGE]
    if low:
        warnings.append(f"the draft vocabulary of {draft_vocab} tokens covers only "
                        f"{', '.join(low)} of the sampled trained tokens: a drafter cannot "
                        "propose the rest; raise stages.train.drafter.draft_vocab_size")
    return out
