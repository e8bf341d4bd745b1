"""Batches packed by length, and how batches are split across workers (GPUs).

Two layouts, both exact (tests compare them with a lone forward of each sample):

- padded: rows of similar length, right-padded, with an attention mask. Sorting by length
  keeps the padding small; right padding keeps every real token's causal past free of pad
  tokens, which is also what gated-delta-net (linear attention) layers need.
- packed: one row of several whole samples, position ids restarting at 0 per sample and no
  attention mask, so transformers builds a block-diagonal causal mask from the position ids
  (`masking_utils.find_packed_sequence_indices`). No padding at all, but only for targets
  whose every layer is softmax attention: a linear-attention state would leak across
  samples in the row.

Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Batch:
    indices: tuple[int, ...]      # dataset row ids, in row order (padded) or pack order
    lengths: tuple[int, ...]
    packed: bool

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def compute_tokens(self) -> int:
        """Positions the model runs over, padding included."""
        return self.tokens if self.packed else len(self.lengths) * max(self.lengths)


def plan_batches(items: list[tuple[int, int]], batch_tokens: int, mode: str) -> list[Batch]:
    """Group (row id, length) items into batches of at most batch_tokens positions.

    Longest first, so a batch that does not fit in memory fails at the start of a run and
    not hours in. A sample longer than batch_tokens gets a batch of its own. Zero-length
    items are the caller's (they need no forward).
    """
    if batch_tokens < 1:
        raise ValueError("batch_tokens must be positive")
    if mode not in ("padded", "packed"):
        raise ValueError(f"mode must be padded or packed, got {mode!r}")
    order = sorted((it for it in items if it[1] > 0), key=lambda it: (-it[1], it[0]))
    batches: list[Batch] = []
    cur_idx: list[int] = []
    cur_len: list[int] = []

    def flush() -> None:
        if cur_idx:
            batches.append(Batch(tuple(cur_idx), tuple(cur_len), mode == "packed"))
            cur_idx.clear()
            cur_len.clear()

    for idx, n in order:
        if cur_idx:
            if mode == "padded":
                # Sorted descending: the first item sets the padded row length.
                fits = (len(cur_len) + 1) * cur_len[0] <= batch_tokens
            else:
                fits = sum(cur_len) + n <= batch_tokens
            if not fits:
                flush()
        cur_idx.append(idx)
        cur_len.append(n)
    flush()
    return batches


def shard_batches(batches: list[Batch], world: int) -> list[list[Batch]]:
    """Split batches over `world` workers, balancing compute tokens (longest-processing-
    time-first; batches already come longest first). Deterministic for a given input."""
    if world < 1:
        raise ValueError("world must be >= 1")
    shards: list[list[Batch]] = [[] for _ in range(world)]
    load = [0] * world
    for b in batches:
        r = min(range(world), key=lambda i: (load[i], i))
        shards[r].append(b)
        load[r] += b.compute_tokens
    return shards
