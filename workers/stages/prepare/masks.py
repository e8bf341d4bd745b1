"""Records -> (input_ids, loss_mask), with a self-check on every record.

`Masker` ties a tokenizer and a chat template together: it measures the template's
generation-prompt header and end-of-turn tokens once, locates the trained character spans of
each record (`spans.py`), tokenizes the renderings in batches with the fast tokenizer and maps
the spans to tokens through the encodings' offsets (no per-token Python loop).

A token that crosses a span boundary (Qwen's `\\s*[\\r\\n]+` merges the `\n` ending the
generation prompt with a reply that begins with a newline) is replaced by the tokens of its
two parts, which is how the target saw it at inference: the prompt tokenized alone, then the
reply. Every other token is the whole rendering's tokenization.

Self-check: the masked tokens of each turn must decode to the text the template rendered for
that turn (normalized as the tokenizer normalizes). A record that fails is rejected with the
reason; a wrong mask is never written. For a byte-level decoder, a turn whose tokens' bytes
(`ByteTable`, the decoder's own rule) are exactly its text passes without a decode call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import decoders

from workers.stages.prepare.spans import (
    KNOWN_END_TOKENS,
    Located,
    RecordRejected,
    SpanLocator,
)
from workers.stages.prepare.templates import (
    ChatTemplate,
    TemplateRenderError,
    special_tokens_of,
    to_template_messages,
)

_PROBES = (
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}],
)


@dataclass
class Encoded:
    """One tokenized record. Arrays are int64, as speculators writes them."""

    input_ids: np.ndarray
    loss_mask: np.ndarray
    token_spans: list[tuple[int, int]] = field(default_factory=list)  # trained [start, end)
    boundary_splits: int = 0      # tokens split because they crossed a span boundary
    turns_without_end: int = 0
    turns_skipped: int = 0
    truncated: bool = False


# Trained turns a Masker checks by decoding before it builds its byte table: building it
# takes ~0.2 s (the Qwen3 vocabulary), decoding a turn ~30 us.
BYTE_TABLE_AFTER = 8192
# GPT-2's byte-to-unicode map, which byte-level BPE vocabularies are written in: printable
# bytes stand for themselves, the others for the code points from U+0100 up, in order.
_PRINTABLE = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
_BYTE_CHARS = dict(zip(_PRINTABLE, _PRINTABLE)) | {
    b: 0x100 + k for k, b in enumerate(b for b in range(256) if b not in set(_PRINTABLE))}
_TO_LATIN1 = {c: chr(b) for b, c in _BYTE_CHARS.items()}   # str.translate: char -> its byte
_DROP_MAPPED = dict.fromkeys(_BYTE_CHARS.values())


class ByteTable:
    """Each token id's bytes as the `ByteLevel` decoder gives them: a token whose characters
    all stand for bytes becomes those bytes, any other token (an added token with a space or
    a character outside the map) its own UTF-8, exactly the decoder's rule. Decoding ids is
    then the concatenation of their bytes read as UTF-8, done for many turns at once with
    numpy (`spells`)."""

    def __init__(self, pieces: list[bytes]):
        self.flat = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        self.length = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        self.start = np.zeros(len(pieces), dtype=np.int64)
        np.cumsum(self.length[:-1], out=self.start[1:])

    @classmethod
    def of(cls, backend) -> "ByteTable | None":
        vocab = backend.get_vocab(with_added_tokens=True)
        if not vocab:
            return None
        tokens = [""] * (max(vocab.values()) + 1)
        for t, i in vocab.items():
            tokens[i] = t
        return cls([t.encode() if t.translate(_DROP_MAPPED) else
                    t.translate(_TO_LATIN1).encode("latin-1") for t in tokens])

    def spells(self, segs: list[np.ndarray], wants: list[str]) -> list[bool]:
        """For each id segment, whether its bytes are valid UTF-8 equal to its text."""
        ids = np.concatenate(segs) if segs else np.zeros(0, dtype=np.int64)
        if not len(ids) or ids.min() < 0 or ids.max() >= len(self.length):
            return [False] * len(segs)
        lens = self.length[ids]
        ends = np.cumsum(lens)  # where each id's bytes end in the output
        # output byte k belongs to the id whose piece covers it: flat[start[id] + k - first]
        idx = np.arange(int(ends[-1])) + np.repeat(self.start[ids] - (ends - lens), lens)
        buf = self.flat[idx].tobytes()
        # each segment's bytes end where its last id's do (an empty segment: where the
        # previous one's did)
        last = np.cumsum([len(x) for x in segs]) - 1
        seg_ends = np.where(last >= 0, ends[np.maximum(last, 0)], 0).tolist()
        out, prev = [], 0
        for want, end in zip(wants, seg_ends):
            try:
                out.append(buf[prev:end].decode("utf-8") == want)
            except UnicodeDecodeError:
                out.append(False)
            prev = end
        return out


class Masker:
    """Tokenizer + compiled template + mask method, built once per job (or per worker)."""

    def __init__(self, tokenizer, template: ChatTemplate, train_on: str = "all",
                 extra_end_token_ids: list[int] | None = None, mask_method: str = "auto"):
        if train_on not in ("all", "last"):
            raise ValueError(f"train_on must be 'all' or 'last', not {train_on!r}")
        self.tokenizer = tokenizer
        self.backend = tokenizer.backend_tokenizer
        self.template = template
        self.train_on = train_on
        self._normalizer = self.backend.normalizer
        self.end_tokens = self._end_tokens(extra_end_token_ids or [])
        self.header, prefixes = self._probe_header()
        self.use_generation = template.has_generation and mask_method == "auto"
        self.method = "generation" if self.use_generation else "anchors"
        self.locator = SpanLocator(template, self.header, prefixes, self.end_tokens, train_on,
                                   self.use_generation)
        # The self-check's byte table (`_exact_turns`): None for a tokenizer whose decoder is
        # not byte-level, else the trained turns left to check before it is built.
        self._bytes: ByteTable | int | None = (
            BYTE_TABLE_AFTER if isinstance(self.backend.decoder, decoders.ByteLevel) else None)

    # -- measured once --------------------------------------------------------------------
    def _end_tokens(self, extra_ids: list[int]) -> list[str]:
        added = set(self.tokenizer.get_added_vocab())
        cands = list(KNOWN_END_TOKENS)
        if self.tokenizer.eos_token:
            cands.append(str(self.tokenizer.eos_token))
        cands += [self.tokenizer.convert_ids_to_tokens(int(i)) for i in extra_ids]
        return sorted({c for c in cands if c and c in added})

    def _probe_header(self) -> tuple[str, list[str]]:
        """What `add_generation_prompt=True` appends: the header before the model's output."""
        for probe in _PROBES:
            try:
                p0 = self.template.render(probe, add_generation_prompt=False)
                p1 = self.template.render(probe, add_generation_prompt=True)
            except TemplateRenderError:
                continue
            if p1.startswith(p0):
                header = p1[len(p0):]
            else:
                # Phi-3.5 ends the no-prompt render with EOS: compare token by token.
                e0 = self.backend.encode(p0, add_special_tokens=False).ids
                e1 = self.backend.encode(p1, add_special_tokens=False)
                k = 0
                while k < min(len(e0), len(e1.ids)) and e0[k] == e1.ids[k]:
                    k += 1
                header = p1[e1.token_to_chars(k)[0]:] if k < len(e1.ids) else ""
            if not header:
                return "", []
            return header, self._header_prefixes(header)
        return "", []

    def _header_prefixes(self, header: str) -> list[str]:
        """Whole-token prefixes of the header that still name the role, longest first.

        Qwen3.5/3.6 render `<|im_start|>assistant\n` without the `<think>\n` of their
        generation prompt in turns whose thinking was stripped; a prefix down to the role name
        (the first word outside the added tokens: `assistant`, `model`, `ASSISTANT`) still
        identifies the header, a bare `<|im_start|>` would not."""
        enc = self.backend.encode(header, add_special_tokens=False)
        added = set(self.tokenizer.get_added_vocab())
        offsets = [enc.token_to_chars(t) for t in range(len(enc.ids))]
        min_len = len(header)
        for a, b in offsets:
            if header[a:b] not in added:
                word = re.compile(r"\w+").match(header, a)
                min_len = word.end() if word else b
                break
        cuts = sorted({b for _a, b in offsets if min_len <= b < len(header)}, reverse=True)
        return [header[:c] for c in cuts]

    # -- per record ------------------------------------------------------------------------
    def locate(self, record: dict) -> Located:
        msgs = to_template_messages(record["messages"])
        return self.locator.locate(msgs, record.get("tools") or None)

    def encode(self, located: list[Located]) -> list[Encoded | RecordRejected]:
        encs = self.backend.encode_batch([loc.text for loc in located], add_special_tokens=False)
        outs = [self._encode_one(loc, enc) for loc, enc in zip(located, encs)]
        exact = self._exact_turns(located, outs)
        return [out if isinstance(out, RecordRejected) else self._self_check(loc, out, ok)
                for loc, out, ok in zip(located, outs, exact)]

    def _encode_one(self, loc: Located, enc) -> Encoded | RecordRejected:
        ids = np.asarray(enc.ids, dtype=np.int64)
        n = len(ids)
        tspans: list[tuple[int, int]] = []
        crossing: dict[int, set[int]] = {}   # token index -> span boundaries inside it
        for s, e in loc.spans:
            ts, tl = enc.char_to_token(s), enc.char_to_token(e - 1)
            if ts is None or tl is None:   # a tokenizer that drops characters (whitespace)
                return self._finish(loc, self._encode_pieces(loc))
            # a character split over several byte-level tokens (𝔸 is four bytes) maps to the
            # first of them: the span ends after the last token that starts before `e`
            while tl + 1 < n and enc.token_to_chars(tl + 1)[0] < e:
                tl += 1
            if enc.token_to_chars(ts)[0] < s:
                crossing.setdefault(ts, set()).add(s)
            if enc.token_to_chars(tl)[1] > e:
                crossing.setdefault(tl, set()).add(e)
            tspans.append((ts, tl + 1))
        mask = np.zeros(n, dtype=np.int64)
        for a, b in tspans:
            mask[a:b] = 1
        if not crossing:
            return self._finish(loc, Encoded(ids, mask, tspans))
        return self._finish(loc, self._split_crossing(loc, enc, ids, mask, crossing))

    def _split_crossing(self, loc: Located, enc, ids: np.ndarray, mask: np.ndarray,
                        crossing: dict[int, set[int]]) -> Encoded:
        """Replace each token that crosses a span boundary by the tokens of its parts.

        Qwen's `\\s*[\\r\\n]+` merges the `\n` ending Qwen3.5/3.6's generation prompt
        (`<think>\n`) with the `\n` the model writes next into one `\n\n` token. At inference
        the prompt was tokenized alone and the model emitted its own `\n`: splitting the
        token at the boundary gives exactly that sequence, and a mask that can be exact."""
        order = sorted(crossing)
        parts, where = [], []
        for i in order:
            a, b = enc.token_to_chars(i)
            cuts = [a, *sorted(crossing[i]), b]
            for x, y in zip(cuts, cuts[1:]):
                parts.append(loc.text[x:y])
                where.append((i, x, y))
        part_encs = self.backend.encode_batch(parts, add_special_tokens=False)
        new_ids, new_mask, prev = [], [], 0
        for (i, x, y), pe in zip(where, part_encs):
            if i >= prev:
                new_ids.append(ids[prev:i])
                new_mask.append(mask[prev:i])
                prev = i + 1
            pid = np.asarray(pe.ids, dtype=np.int64)
            inside = any(s <= x and y <= e for s, e in loc.spans)
            new_ids.append(pid)
            new_mask.append(np.full(len(pid), int(inside), dtype=np.int64))
        new_ids.append(ids[prev:])
        new_mask.append(mask[prev:])
        ids, mask = np.concatenate(new_ids), np.concatenate(new_mask)
        edges = np.flatnonzero(np.diff(np.concatenate(([0], mask, [0]))))
        tspans = list(zip(edges[::2].tolist(), edges[1::2].tolist()))
        return Encoded(ids, mask, tspans, boundary_splits=len(crossing))

    def _finish(self, loc: Located, out: Encoded) -> Encoded | RecordRejected:
        out.turns_without_end = loc.turns_without_end
        out.turns_skipped = loc.turns_skipped
        if len(out.token_spans) != len(loc.spans):
            return RecordRejected("self_check_failed", f"{len(loc.spans)} trained turns became "
                                  f"{len(out.token_spans)} masked runs")
        return out

    def _encode_pieces(self, loc: Located) -> Encoded:
        """Tokenize the text split at the span boundaries (tokenizers whose offsets do not
        cover every character)."""
        bounds = [0] + [x for s in loc.spans for x in s] + [len(loc.text)]
        pieces = [loc.text[a:b] for a, b in zip(bounds, bounds[1:])]
        encs = self.backend.encode_batch(pieces, add_special_tokens=False)
        ids_parts, mask_parts, tspans, n = [], [], [], 0
        for k, en in enumerate(encs):
            part = np.asarray(en.ids, dtype=np.int64)
            ids_parts.append(part)
            trained = k % 2 == 1
            mask_parts.append(np.full(len(part), int(trained), dtype=np.int64))
            if trained:
                tspans.append((n, n + len(part)))
            n += len(part)
        return Encoded(np.concatenate(ids_parts), np.concatenate(mask_parts), tspans,
                       boundary_splits=len(loc.spans))

    def _exact_turns(self, located: list[Located], outs: list[Encoded | RecordRejected]
                     ) -> list[list[bool]]:
        """Per record and trained turn: whether its masked tokens' bytes are exactly the text
        the template rendered for it. This is the self-check's common case without a decode
        call per turn (a sixth of a worker's time besides encoding): the bytes come from the
        byte-level decoder's own table (`ByteTable`), for all turns of the batch at once. A
        turn that is not exact (or every turn, without a table) gets the decode check."""
        exact: list[list[bool]] = [[] for _ in outs]
        if self._bytes is None:
            return exact
        if not isinstance(self._bytes, ByteTable):
            self._bytes -= sum(len(loc.spans) for loc in located)
            if self._bytes > 0:  # a small job: not worth building the table
                return exact
            self._bytes = ByteTable.of(self.backend)
            if self._bytes is None:
                return exact
        owner, wants, segs = [], [], []
        for r, (loc, out) in enumerate(zip(located, outs)):
            if isinstance(out, Encoded):
                for (s, e), (a, b) in zip(loc.spans, out.token_spans):
                    owner.append(r)
                    wants.append(loc.text[s:e])
                    segs.append(out.input_ids[a:b])
        for r, ok in zip(owner, self._bytes.spells(segs, wants)):
            exact[r].append(ok)
        return exact

    def _self_check(self, loc: Located, out: Encoded, exact: list[bool] | None = None
                    ) -> Encoded | RecordRejected:
        for k, ((s, e), (a, b)) in enumerate(zip(loc.spans, out.token_spans)):
            if exact and exact[k]:
                continue
            want = loc.text[s:e]
            got = self.backend.decode(out.input_ids[a:b].tolist(), skip_special_tokens=False)
            if got != want and self._normalizer is not None:
                # compare with the text as the tokenizer normalizes it (Qwen: NFC); only on
                # a difference, normalizing costs as much as decoding
                want = self._normalizer.normalize_str(want)
            if got != want and not self._decodes_in_context(out.input_ids, a, b, want):
                return RecordRejected(
                    "self_check_failed",
                    f"trained turn {k}: masked tokens decode to {_clip(got)!r}, "
                    f"the template rendered {_clip(want)!r}")
        return out

    def _decodes_in_context(self, ids: np.ndarray, a: int, b: int, want: str) -> bool:
        # SentencePiece (Metaspace) decoders drop the leading space of the first token they
        # decode; judged inside its left context the span may still be exact.
        dec = self.backend.decode
        before = dec(ids[:a].tolist(), skip_special_tokens=False)
        return dec(ids[:b].tolist(), skip_special_tokens=False) == before + want


def _clip(s: str, n: int = 120) -> str:
    return s if len(s) <= n else s[: n // 2] + " ... " + s[-n // 2:]


# -- building a Masker ---------------------------------------------------------------------
def load_tokenizer(path: str | Path):
    from workers.stages.tokenizer_load import load_auto_tokenizer

    tok = load_auto_tokenizer(path)  # AutoTokenizer's, without importing torch when it can
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"the tokenizer at {path} has no fast (Rust) version; prepare needs "
                         "its offsets")
    return tok


def generation_eos_ids(model_dir: str | Path | None) -> list[int]:
    """The target's generation_config eos ids: what it stops on at inference."""
    if not model_dir:
        return []
    p = Path(model_dir) / "generation_config.json"
    if not p.is_file():
        return []
    eos = json.loads(p.read_text()).get("eos_token_id")
    return [int(x) for x in (eos if isinstance(eos, list) else [eos]) if x is not None]


def build_masker(tokenizer, template_text: str, chat_template_kwargs: dict | None = None,
                 train_on: str = "all", now: datetime | None = None,
                 extra_end_token_ids: list[int] | None = None, mask_method: str = "auto"
                 ) -> Masker:
    tmpl = ChatTemplate(template_text, special_tokens_of(tokenizer),
                        dict(chat_template_kwargs or {}), now or datetime.now(timezone.utc))
    return Masker(tokenizer, tmpl, train_on, extra_end_token_ids, mask_method)


_MASKERS: dict[tuple, Masker] = {}


def tokenize_record(record: dict, tokenizer, template: str | None = None,
                    kwargs: dict | None = None, train_on: str = "all"
                    ) -> tuple[list[int], list[int]]:
    """One record -> (input_ids, loss_mask); raises RecordRejected(code, detail).

    For the planner's samples; the stage itself uses `Masker` in batches. `template` None is
    the tokenizer's own chat template.
    """
    text = template if template is not None else tokenizer.chat_template
    key = (id(tokenizer), text, json.dumps(kwargs or {}, sort_keys=True), train_on)
    m = _MASKERS.get(key)
    if m is None:
        if len(_MASKERS) > 16:
            _MASKERS.clear()
        m = _MASKERS[key] = build_masker(tokenizer, text, kwargs, train_on)
    out = m.encode([m.locate(record)])[0]
    if isinstance(out, RecordRejected):
        raise out
    return out.input_ids.tolist(), out.loss_mask.tolist()


def apply_length(out: Encoded, seq_length: int | None, policy: str, min_valid_tokens: int
                 ) -> Encoded:
    """seq_length with policy truncate|drop, then min_valid_tokens; raises RecordRejected."""
    n = len(out.input_ids)
    if seq_length is not None and n > seq_length:
        if policy == "drop":
            raise RecordRejected("too_long", f"{n} tokens > seq_length {seq_length}")
        out.input_ids = out.input_ids[:seq_length]
        out.loss_mask = out.loss_mask[:seq_length]
        out.truncated = True
    valid = int(out.loss_mask.sum())
    if valid < min_valid_tokens:
        why = f" after truncation to {seq_length}" if len(out.input_ids) < n else ""
        raise RecordRejected("too_few_valid_tokens",
                             f"{valid} trained tokens{why} < min_valid_tokens {min_valid_tokens}")
    return out


def tokenize_batch(masker: Masker, records: list[dict], seq_length: int | None = None,
                   length_policy: str = "truncate", min_valid_tokens: int = 1
                   ) -> list[Encoded | RecordRejected]:
    """Records in, one result per record out (same order)."""
    results: list[Any] = [None] * len(records)
    located, where = [], []
    for k, rec in enumerate(records):
        try:
            located.append(masker.locate(rec))
            where.append(k)
        except RecordRejected as e:
            results[k] = e
    for k, out in zip(where, masker.encode(located) if located else []):
        if not isinstance(out, RecordRejected):
            try:
                out = apply_length(out, seq_length, length_policy, min_valid_tokens)
            except RecordRejected as e:
                out = e
        results[k] = out
    return results
