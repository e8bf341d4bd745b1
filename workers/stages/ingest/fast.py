"""The vectorized path of ingest: the flat formats' records built column-wise with Arrow.

A run of input records that share one key set (consecutive JSON objects with the same keys, or
the rows of one Parquet batch) has one format (`formats.detect_one` reads keys only, up to the
formats mapped here). Its mapper takes the run's columns and gives back, per record, whether
the per-line normalizer would turn it into one plain record, and the records of those that it
would: `(own_id | None, messages)` as Arrow columns. Everything the normalizers treat specially
(a wrong type, a null where a field is required, an empty prompt or answer turn, think tags,
history, tools, roles other than user/assistant/system, content parts...) marks its record as
not clean, and ingest sends that record through the per-line path instead, so rejects, their
lines and reasons, and every record the normalizers build specially stay theirs.

Mapped: Alpaca and Evol-CodeAlpaca, OpenOrca, Magicoder (single-turn `_single_turn` shapes),
ShareGPT and LIMA (`conversations` as `{"from", "value"}` turns or as strings) and OpenAI
`messages` of plain `{"role", "content"}` turns. The rest (OpenAssistant, UltraChat, bare
prompts) is per line.

`ENABLED` turns the path off (tests compare both paths' outputs byte for byte, field for field).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from workers.stages.ingest import formats as F
from workers.stages.ingest.messages import own_id
from workers.stages.records import MESSAGE_TYPE

ENABLED = True
MIN_RUN = 8  # shorter runs of one key set go per line: their Arrow set-up costs more

_STR = pa.string()
# Every character Python's str.isspace() accepts (tests/stages/test_ingest_fast.py checks the
# set against all of Unicode): a field is blank for the normalizers when it is "" or made of
# these only, and RE2 matches the same set.
WHITESPACE = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004"
              "\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
_BLANK_RE = "^[" + "".join(f"\\x{{{ord(c):x}}}" for c in WHITESPACE) + "]*$"

SYSTEM, USER, ASSISTANT = 0, 1, 2
_ROLE_NAMES = ("system", "user", "assistant")
_ROLES = pa.array(_ROLE_NAMES, _STR)
# ShareGPT speakers the plain path maps to these roles (formats.SHAREGPT_ROLES, also lowered)
_SHAREGPT_CODES = {k: _ROLE_NAMES.index(v) for k, v in F.SHAREGPT_ROLES.items()
                   if v in _ROLE_NAMES}
_OPENAI_CODES = {"system": SYSTEM, "developer": SYSTEM, "user": USER, "assistant": ASSISTANT}


class Rows:
    """One run of records with the same keys: a column's values as strings or as Python
    objects. A key the run lacks reads as all null (what `dict.get` gives)."""

    n: int
    keys: frozenset

    def py(self, key: str) -> list:
        raise NotImplementedError

    def _arrow(self, key: str) -> pa.Array | None:
        return None

    def strings(self, key: str) -> tuple[pa.Array, np.ndarray | None]:
        """(string array, null where the value is None or another type; mask of the records
        whose value is neither a string nor None, or None when there is none)."""
        if key not in self.keys:
            return pa.nulls(self.n, _STR), None
        arr = self._arrow(key)
        if arr is not None:
            return arr, None
        vals = self.py(key)
        try:
            return pa.array(vals, _STR), None
        except (pa.ArrowTypeError, pa.ArrowInvalid):
            other = np.fromiter((v is not None and type(v) is not str for v in vals), bool,
                                len(vals))
            return pa.array([v if type(v) is str else None for v in vals], _STR), other


class DictRows(Rows):
    """Parsed JSON objects (every one has exactly `keys`)."""

    def __init__(self, objs: list[dict]):
        self.objs = objs
        self.n = len(objs)
        self.keys = frozenset(objs[0])

    def py(self, key: str) -> list:
        if key not in self.keys:
            return [None] * self.n
        return [o[key] for o in self.objs]


class BatchRows(Rows):
    """A Parquet record batch: its rows are `batch.to_pylist()` for the per-line path, so
    every column is a key of every row."""

    def __init__(self, batch: pa.RecordBatch):
        self.batch = batch
        self.n = batch.num_rows
        self.keys = frozenset(batch.schema.names)

    def py(self, key: str) -> list:
        if key not in self.keys:
            return [None] * self.n
        return self.batch.column(key).to_pylist()

    def _arrow(self, key: str) -> pa.Array | None:
        col = self.batch.column(key)
        t = col.type
        if t == _STR:
            return col
        if pa.types.is_large_string(t) or pa.types.is_string_view(t) or (
                pa.types.is_dictionary(t) and pa.types.is_string(t.value_type)):
            return col.cast(_STR)
        return None


def batch_keys_ok(batch: pa.RecordBatch) -> bool:
    names = batch.schema.names
    return len(set(names)) == len(names)


# -- vectorized checks ------------------------------------------------------------------------
def _np(arr: pa.Array) -> np.ndarray:
    return arr.to_numpy(zero_copy_only=False)


def _valid(arr: pa.Array) -> np.ndarray:
    return _np(arr.is_valid())


def _blank(arr: pa.Array) -> np.ndarray:
    """Blank for the normalizers (`not s or s.isspace()`); null counts as not blank."""
    return _np(pc.fill_null(pc.match_substring_regex(arr, _BLANK_RE), False))


_THINK = re.compile(b"</think>")


def _has_think(arr: pa.Array) -> np.ndarray:
    """Records with think tags. Most runs have none anywhere: one search of the string
    bytes (a superset of the values') settles it; per value only when it finds one."""
    data = arr.buffers()[2]
    if data is None or _THINK.search(memoryview(data)) is None:
        return np.zeros(len(arr), bool)
    return _np(pc.fill_null(pc.match_substring(arr, "</think>"), False))


def _select(arr: pa.Array, mask: np.ndarray) -> pa.Array:
    return arr if mask.all() else arr.filter(pa.array(mask))


def _other(mask: np.ndarray | None, n: int) -> np.ndarray:
    return np.zeros(n, bool) if mask is None else mask


# -- messages from parts ----------------------------------------------------------------------
class Part:
    """Messages of one kind for some records: `rows` (record index of each message, in
    order), their role codes, and their contents: `content[at]` (all of `content` when `at`
    is None). Taking by index from the whole column spares a filtered copy of it."""

    def __init__(self, rows: np.ndarray, roles: np.ndarray | int, content: pa.Array,
                 at: np.ndarray | None = None):
        self.rows = rows
        self.roles = (np.full(len(rows), roles, np.int8) if isinstance(roles, int)
                      else roles.astype(np.int8))
        self.content = content
        self.at = np.arange(len(content)) if at is None else at


def _messages(n: int, parts: Sequence[Part]) -> pa.Array:
    """list<message> for records 0..n-1: each record's messages are its entries of the parts,
    part by part in the order given, in entry order within a part."""
    rows = np.concatenate([p.rows for p in parts])
    order = np.argsort(rows, kind="stable")
    roles = np.concatenate([p.roles for p in parts])[order]
    base = np.cumsum([0] + [len(p.content) for p in parts[:-1]])
    at = np.concatenate([p.at + b for p, b in zip(parts, base)])[order]
    source = (parts[0].content if len(parts) == 1 else
              pa.concat_arrays([p.content for p in parts]))
    content = source.take(pa.array(at))
    role = _ROLES.take(pa.array(roles))
    m = len(rows)
    none = pa.nulls(m, _STR)
    struct = pa.StructArray.from_arrays([role, content, none, none, none, none],
                                        fields=list(MESSAGE_TYPE))
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(np.bincount(rows, minlength=n), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), struct)


# -- ids --------------------------------------------------------------------------------------
def _own_ids(rows: Rows, key: str, alt: str | None = None) -> pa.Array:
    """`messages.own_id(obj.get(key))` (falling back on `alt` where that is None) per record."""
    arr, other = rows.strings(key)
    if other is None and (alt is None or alt not in rows.keys or arr.null_count == 0):
        # strings (or null): own_id is the string, or None for ""
        return pc.if_else(pc.equal(arr, ""), pa.nulls(len(arr), _STR), arr)
    vals = rows.py(key)
    if alt is not None:
        vals = [v if v is not None else a for v, a in zip(vals, rows.py(alt))]
    return pa.array([own_id(v) for v in vals], _STR)


def _truthy(rows: Rows, key: str) -> np.ndarray:
    """Records whose value at key is truthy (the normalizers' `if obj.get(key):`)."""
    if key not in rows.keys:
        return np.zeros(rows.n, bool)
    return np.fromiter((bool(v) for v in rows.py(key)), bool, rows.n)


# -- mappers ----------------------------------------------------------------------------------
Mapped = tuple[np.ndarray, pa.Array, pa.Array]  # (clean mask, own ids, messages) of clean rows


def _single_turn(rows: Rows, prompt: tuple, answer: tuple, system: tuple | None,
                 unclean: np.ndarray, ids: pa.Array) -> Mapped:
    """formats._single_turn over columns: [system?, user, assistant?]. `prompt`, `answer`,
    `system`: (string array, other-type mask) as `Rows.strings` gives them."""
    n = rows.n
    p, p_other = prompt
    a, a_other = answer
    bad = unclean | _other(p_other, n) | _other(a_other, n)
    bad |= ~_valid(p) | _blank(p)            # NoMatch (None) or an empty prompt: rejected
    has_a = _valid(a) & ~_blank(a)
    bad |= has_a & _has_think(a)             # think tags: split by messages.assistant
    if system is not None:
        s, s_other = system
        bad |= _other(s_other, n)
        has_s = _valid(s) & ~_blank(s)
    ok = ~bad
    if not ok.any():
        return ok, pa.nulls(0, _STR), pa.nulls(0, pa.list_(MESSAGE_TYPE))
    index = np.cumsum(ok) - 1  # a record's index among the clean ones
    parts = []
    if system is not None:
        has_s &= ok
        parts.append(Part(index[has_s], SYSTEM, s, np.flatnonzero(has_s)))
    parts.append(Part(index[ok], USER, p, np.flatnonzero(ok)))
    has_a &= ok
    parts.append(Part(index[has_a], ASSISTANT, a, np.flatnonzero(has_a)))
    return ok, _select(ids, ok), _messages(int(index[-1]) + 1, parts)


def _coalesce(rows: Rows, first: str, second: str) -> tuple[pa.Array, np.ndarray | None]:
    """`obj.get(first)`, or `obj.get(second)` where that is None."""
    a, a_other = rows.strings(first)
    if second not in rows.keys:
        return a, a_other
    b, b_other = rows.strings(second)
    # conservative: a wrong type in either column sends the record per line
    other = None if a_other is None and b_other is None else (
        _other(a_other, rows.n) | _other(b_other, rows.n))
    return pc.coalesce(a, b), other


def _inputs_joined(rows: Rows) -> tuple[tuple, np.ndarray]:
    """Alpaca's prompt: `instruction`, then a blank line and `input` where input is truthy."""
    ins, ins_other = rows.strings("instruction")
    bad = _other(ins_other, rows.n)
    if "input" not in rows.keys:
        return (ins, None), bad
    inp, inp_other = rows.strings("input")
    bad |= _other(inp_other, rows.n)
    joined = pc.binary_join_element_wise(ins, inp, "\n\n")
    use = pc.fill_null(pc.greater(pc.binary_length(inp), 0), False)
    return (pc.if_else(use, joined, ins), None), bad


def alpaca(rows: Rows) -> Mapped:
    prompt, bad = _inputs_joined(rows)
    bad |= _truthy(rows, "history")
    return _single_turn(rows, prompt, _coalesce(rows, "output", "response"),
                        rows.strings("system"), bad, _own_ids(rows, "id"))


def openorca(rows: Rows) -> Mapped:
    return _single_turn(rows, rows.strings("question"), _coalesce(rows, "response", "answer"),
                        rows.strings("system_prompt"), np.zeros(rows.n, bool),
                        _own_ids(rows, "id"))


def magicoder(rows: Rows) -> Mapped:
    return _single_turn(rows, rows.strings("problem"), rows.strings("solution"), None,
                        np.zeros(rows.n, bool), _own_ids(rows, "id", "index"))


Turn = tuple[int, str] | None  # (role code, content) of a plain turn, None for any other


def _turns(rows: Rows, key: str, plain: Callable[[Any, int], Turn],
           ) -> tuple[np.ndarray, list[int], list[int], list[str]]:
    """Flatten the turn lists at key: (unclean mask, record index, role code and content of
    every turn of the other records). `plain(turn, i)` (i from 1) reads one turn; a record
    with a turn that is not plain, or with no list of turns, goes per line."""
    bad = np.zeros(rows.n, bool)
    rec: list[int] = []
    codes: list[int] = []
    texts: list[str] = []
    for r, turns in enumerate(rows.py(key)):
        if type(turns) is not list or not turns:
            bad[r] = True
            continue
        got = [plain(t, i) for i, t in enumerate(turns, 1)]
        if None in got:
            bad[r] = True
            continue
        rec.extend([r] * len(got))
        for code, text in got:  # type: ignore[misc]
            codes.append(code)
            texts.append(text)
    return bad, rec, codes, texts


def _conversation(rows: Rows, key: str, plain: Callable[[Any, int], Turn],
                  system: tuple | None, unclean: np.ndarray, ids: pa.Array) -> Mapped:
    """Multi-turn records: a user or assistant turn must not be blank, an assistant turn must
    have no think tags, a blank system turn is dropped, and a record needs a user or assistant
    turn (messages.check_record)."""
    n = rows.n
    bad, rec, codes, texts = _turns(rows, key, plain)
    bad |= unclean
    rec_a = np.array(rec, np.int64)
    code_a = np.array(codes, np.int8)
    content = pa.array(texts, _STR)
    is_sys = code_a == SYSTEM
    blank = _blank(content)
    bad_turn = (~is_sys & blank) | ((code_a == ASSISTANT) & _has_think(content))
    np.logical_or.at(bad, rec_a[bad_turn], True)
    speaking = np.zeros(n, bool)
    speaking[rec_a[~is_sys]] = True
    bad |= ~speaking
    if system is not None:
        s, s_other = system
        bad |= _other(s_other, n)
    ok = ~bad
    if not ok.any():
        return ok, pa.nulls(0, _STR), pa.nulls(0, pa.list_(MESSAGE_TYPE))
    index = np.cumsum(ok) - 1  # a record's index among the clean ones
    keep_turn = ok[rec_a] & ~(is_sys & blank)
    parts = []
    if system is not None:
        has_s = _valid(s) & ~_blank(s) & ok
        parts.append(Part(index[has_s], SYSTEM, s, np.flatnonzero(has_s)))
    parts.append(Part(index[rec_a[keep_turn]], code_a[keep_turn], content,
                      np.flatnonzero(keep_turn)))
    return ok, _select(ids, ok), _messages(int(index[-1]) + 1, parts)


def _sharegpt_turn(t: Any, i: int) -> Turn:
    if type(t) is str:  # LIMA: strings, user first
        return (USER if i % 2 else ASSISTANT), t
    if type(t) is dict and len(t) == 2:
        speaker, value = t.get("from"), t.get("value")
        if type(speaker) is str and type(value) is str:
            code = _SHAREGPT_CODES.get(speaker)
            if code is None and F.SHAREGPT_ROLES.get(speaker) is None:
                code = _SHAREGPT_CODES.get(speaker.lower())
            if code is not None:
                return code, value
    return None


def sharegpt(rows: Rows) -> Mapped:
    # `conversation` is read where `conversations` is None: such records are not lists of
    # turns here, so they go per line
    key = "conversations" if "conversations" in rows.keys else "conversation"
    return _conversation(rows, key, _sharegpt_turn, rows.strings("system"),
                         _truthy(rows, "tools"), _own_ids(rows, "id"))


def _openai_turn(t: Any, i: int) -> Turn:
    if type(t) is dict and len(t) == 2:
        role, content = t.get("role"), t.get("content")
        if type(role) is str and type(content) is str:
            code = _OPENAI_CODES.get(role)
            if code is not None:
                return code, content
    return None


def openai(rows: Rows) -> Mapped:
    return _conversation(rows, "messages", _openai_turn, None, _truthy(rows, "tools"),
                         _own_ids(rows, "id"))


MAPPERS: dict[str, Callable[[Rows], Mapped]] = {
    "alpaca": alpaca, "evol_codealpaca": alpaca, "openorca": openorca, "magicoder": magicoder,
    "sharegpt": sharegpt, "openai": openai}


def mapper(fmt: str | None) -> Callable[[Rows], Mapped] | None:
    return MAPPERS.get(fmt) if ENABLED and fmt is not None else None
