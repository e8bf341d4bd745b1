"""The self-check's byte table (masks.ByteTable): a turn's masked tokens are checked against
the rendered text by concatenating their bytes, instead of a decode call per turn. It must be
exactly the byte-level decoder's rule, and the masks, rejections and self-check verdicts must
be those of the decode path."""

from __future__ import annotations

import numpy as np
import pytest

from tests.stages.prepare_support import TEMPLATE_FAMILY, rec, small_tokenizer
from tests.stages.test_prepare_masks import (
    ALT, CASES, FULL, NOW, REAL_QWEN, random_conversation, template_text, tokenizer_for,
)

from workers.stages.prepare import masks
from workers.stages.prepare.masks import ByteTable, build_masker, tokenize_batch
from workers.stages.prepare.spans import RecordRejected


def _odd_tokenizer():
    """Byte-level BPE with added tokens the decoder passes through as UTF-8: a space, a
    fullwidth bar, a mapped character beside an unmapped one."""
    tok = small_tokenizer("chatml")
    tok.add_tokens(["<｜end▁of▁sentence｜>", "two words", "Ġx y", "éÿ"])
    return tok


@pytest.mark.parametrize("which", ["qwen3", "chatml", "llama3", "harmony", "odd"])
def test_the_table_is_the_decoders_own_bytes(which, qwen_tok):
    tok = {"qwen3": lambda: qwen_tok, "odd": _odd_tokenizer}.get(
        which, lambda: small_tokenizer(which))()
    be = tok.backend_tokenizer
    table = ByteTable.of(be)
    assert table is not None and len(table.length) == be.get_vocab_size(with_added_tokens=True)
    for i in range(len(table.length)):
        piece = table.flat[table.start[i]:table.start[i] + table.length[i]].tobytes()
        assert piece.decode("utf-8", "replace") == be.decode([i], skip_special_tokens=False), i


def test_spells_only_what_decodes_to_the_text(qwen_tok):
    be = qwen_tok.backend_tokenizer
    table = ByteTable.of(be)
    text = "Héllo 𝔸 world<|im_end|>"
    ids = np.asarray(be.encode(text, add_special_tokens=False).ids, dtype=np.int64)
    cut = next(k for k in range(1, len(ids))           # a cut inside the four-byte 𝔸
               if "\ufffd" in be.decode(ids[:k].tolist()))
    assert table.spells([ids, ids[:-1], ids[1:], ids[:cut], ids[:0]],
                        [text, text, text, text, ""]) == [True, False, False, False, True]
    assert table.spells([ids], ["Hello 𝔸 world<|im_end|>"]) == [False]
    assert table.spells([np.array([len(table.length)])], ["x"]) == [False]  # out of range


class _Counting:
    """The tokenizer backend, counting decode calls."""

    def __init__(self, backend):
        self._b, self.decodes = backend, 0

    def decode(self, *a, **k):
        self.decodes += 1
        return self._b.decode(*a, **k)

    def __getattr__(self, name):
        return getattr(self._b, name)


def _masker(tok, text, table: bool, monkeypatch):
    monkeypatch.setattr(masks, "BYTE_TABLE_AFTER", 0 if table else 10**9)
    mk = build_masker(tok, text, None, "all", NOW)
    mk.backend = _Counting(mk.backend)
    return mk


def _same(a, b) -> bool:
    if isinstance(a, RecordRejected) or isinstance(b, RecordRejected):
        return (type(a), getattr(a, "code", None), str(a)) == (type(b), getattr(b, "code", None),
                                                               str(b))
    return (a.input_ids.tolist(), a.loss_mask.tolist(), a.token_spans, a.boundary_splits) == (
        b.input_ids.tolist(), b.loss_mask.tolist(), b.token_spans, b.boundary_splits)


@pytest.mark.parametrize("name", sorted(TEMPLATE_FAMILY))
def test_the_table_gives_the_decode_paths_results(name, templates_dir, qwen_tok, monkeypatch):
    """Every template on the hand-written and 25 random conversations: with the table the
    results are those of the decode path, and a clean turn is checked without decoding."""
    tok = tokenizer_for(name, qwen_tok, name in REAL_QWEN)
    text = template_text(templates_dir, name)
    convs = [FULL, ALT, FULL[1:], *(random_conversation(seed) for seed in range(25))]
    if name in CASES:
        convs.append(CASES[name][0])
    recs = [rec(c, f"r{k}") for k, c in enumerate(convs)]
    slow, fast = _masker(tok, text, False, monkeypatch), _masker(tok, text, True, monkeypatch)
    want, got = tokenize_batch(slow, recs, 4096), tokenize_batch(fast, recs, 4096)
    assert all(_same(a, b) for a, b in zip(want, got))
    turns = sum(len(x.token_spans) for x in got if not isinstance(x, RecordRejected))
    assert turns and slow.backend.decodes >= turns
    assert isinstance(fast._bytes, ByteTable) and fast.backend.decodes == 0


def test_a_tokenizer_without_a_byte_level_decoder_keeps_decoding(templates_dir, monkeypatch):
    from tokenizers import decoders

    tok = small_tokenizer("chatml")
    tok.backend_tokenizer.decoder = decoders.Sequence([decoders.ByteLevel()])
    mk = _masker(tok, template_text(templates_dir, "chatml"), True, monkeypatch)
    out = tokenize_batch(mk, [rec(FULL)])
    assert not isinstance(out[0], RecordRejected)
    assert mk._bytes is None and mk.backend.decodes == len(out[0].token_spans)


def test_small_jobs_do_not_build_the_table(templates_dir, qwen_tok):
    mk = build_masker(qwen_tok, template_text(templates_dir, "qwen3"), None, "all", NOW)
    tokenize_batch(mk, [rec(FULL, f"r{k}") for k in range(20)])
    assert mk._bytes == masks.BYTE_TABLE_AFTER - 20 * 3    # three trained turns each
