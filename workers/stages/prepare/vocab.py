"""Token frequencies over trained tokens, and the draft-vocabulary mapping built from them.

The files are the ones `speculators train` reads from its data path: `token_freq.pt` (a dict
token id -> count, counted only where loss_mask is 1, like its
`save_token_frequency_distribution`) and, for a draft vocabulary of N tokens,
`d2t-N.npy` / `t2d-N.npy` as its `build_vocab_mappings_from_distribution` builds them
(d2t: int64 offsets, target id = draft index + d2t[draft index]; t2d: bool over the target
vocabulary), so `--draft-vocab-size N` finds and loads them instead of recounting.

The mapping is computed here with numpy (`vocab_mapping`; tests/stages/test_prepare_vocab.py
holds it equal to speculators' function): importing speculators for it made every prepare
process load the whole library (its models, `datasets`, an OpenAI client), several CPU
seconds per stage for a sort of a few thousand counts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from contracts.target import text_value


class TokenCounter:
    """Dense counts over the vocabulary; workers send (unique ids, counts) per chunk."""

    def __init__(self, vocab_size: int):
        self.counts = np.zeros(vocab_size, dtype=np.int64)

    def add(self, ids: np.ndarray, counts: np.ndarray) -> None:
        if len(ids) and int(ids.max()) >= len(self.counts):
            grown = np.zeros(int(ids.max()) + 1, dtype=np.int64)
            grown[: len(self.counts)] = self.counts
            self.counts = grown
        self.counts[ids] += counts  # ids are unique (chunk_frequencies)

    def as_dict(self) -> dict[int, int]:
        nz = np.nonzero(self.counts)[0]
        return {int(i): int(self.counts[i]) for i in nz}


def chunk_frequencies(flat_ids: np.ndarray, flat_mask: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(ids, counts) of the masked tokens of a chunk (ids end to end, masks alike), ids
    ascending and unique."""
    counts = np.bincount(flat_ids[flat_mask != 0].astype(np.int64, copy=False))
    seen = np.flatnonzero(counts)
    return seen, counts[seen]


def save_token_freq(path: Path, freq: dict[int, int]) -> None:
    import torch

    torch.save(freq, str(path))


def target_vocab_size(config: dict | None, tokenizer_len: int) -> int:
    """The target's embedding rows (config.vocab_size, or its text_config's), as speculators
    reads it; the tokenizer length when there is no config."""
    v = text_value(config, "vocab_size")
    return int(v) if v else int(tokenizer_len)


def vocab_mapping(freq: dict[int, int], draft_vocab_size: int,
                  vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(d2t, t2d) for a draft vocabulary of `draft_vocab_size` tokens: the most frequent
    trained tokens (ties: the lower id first); when fewer tokens were seen, the lowest ids
    not yet chosen fill the rest. d2t[i] = (i-th chosen id, ascending) - i; t2d marks the
    chosen ids over the target's vocabulary."""
    ids = np.fromiter(freq.keys(), dtype=np.int64, count=len(freq))
    counts = np.fromiter(freq.values(), dtype=np.int64, count=len(freq))
    chosen = ids[np.lexsort((ids, -counts))][:draft_vocab_size]
    if len(chosen) < draft_vocab_size:
        rest = np.setdiff1d(np.arange(draft_vocab_size, dtype=np.int64), chosen)
        chosen = np.concatenate([chosen, rest[:draft_vocab_size - len(chosen)]])
    chosen = np.sort(chosen)
    d2t = chosen - np.arange(draft_vocab_size, dtype=np.int64)
    t2d = np.zeros(vocab_size, dtype=bool)
    t2d[chosen] = True
    return d2t, t2d


def save_vocab_mapping(folder: Path, freq: dict[int, int], draft_vocab_size: int,
                       vocab_size: int) -> tuple[Path, Path]:
    d2t, t2d = vocab_mapping(freq, draft_vocab_size, vocab_size)
    d2t_path = Path(folder) / f"d2t-{draft_vocab_size}.npy"
    t2d_path = Path(folder) / f"t2d-{draft_vocab_size}.npy"
    np.save(d2t_path, d2t)
    np.save(t2d_path, t2d)
    return d2t_path, t2d_path
