"""prepare's draft-vocabulary mapping equals speculators' `build_vocab_mappings_from_distribution`
(the files `speculators train --draft-vocab-size N` loads), computed without importing the
library in the prepare process."""

from __future__ import annotations

import numpy as np
import pytest

from workers.stages.prepare.vocab import save_vocab_mapping, vocab_mapping


@pytest.mark.parametrize("seen, draft, vocab, seed", [
    (5000, 256, 151_669, 0),   # more tokens seen than the draft vocabulary holds
    (300, 1024, 4096, 1),      # fewer: the lowest unchosen ids fill the rest
    (0, 16, 64, 2),            # nothing trained
    (2000, 2000, 2000, 3),     # the draft vocabulary is the whole vocabulary
])
def test_mapping_equals_speculators(seen, draft, vocab, seed):
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    rng = np.random.default_rng(seed)
    ids = rng.choice(vocab, size=min(seen, vocab), replace=False)
    # few distinct counts, so ties (broken by the lower id) are common
    freq = {int(i): int(c) for i, c in zip(ids, rng.integers(1, 6, size=len(ids)))}
    d2t, t2d = vocab_mapping(freq, draft, vocab)
    want_d2t, want_t2d = build_vocab_mappings_from_distribution(
        token_freq_dict=freq, draft_vocab_size=draft, target_vocab_size=vocab)
    assert d2t.dtype == np.int64 and t2d.dtype == np.bool_
    assert np.array_equal(d2t, want_d2t.numpy()) and np.array_equal(t2d, want_t2d.numpy())


def test_files_are_what_speculators_loads(tmp_path):
    d2t_path, t2d_path = save_vocab_mapping(tmp_path, {7: 3, 2: 3, 9: 1}, 4, 16)
    assert (d2t_path.name, t2d_path.name) == ("d2t-4.npy", "t2d-4.npy")
    # chosen: 2 and 7 (count 3, lower id first), 9, then the lowest unchosen id 0
    assert np.load(d2t_path).tolist() == [0 - 0, 2 - 1, 7 - 2, 9 - 3]
    assert np.flatnonzero(np.load(t2d_path)).tolist() == [0, 2, 7, 9]
