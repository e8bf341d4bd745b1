"""The fast path of ingest: the flat formats' records built column-wise, one Arrow conversion
per block instead of one nested conversion per record.

A run of input records that share one key set (consecutive JSON objects with the same keys, or
the rows of one Parquet batch) has one format (`formats.detect_one` reads keys only, up to the
formats mapped here). Its mapper reads the run's columns and gives back, per record, whether
the per-line normalizer would turn it into plain messages (role and content only), and the
messages of those records, flattened: every content in order, their roles, a count per
record. One `pyarrow.array` of the contents then makes the `messages` column of the whole run
(the per-line path converts nested message tuples record by record, a quarter of its time).

Everything a normalizer treats specially marks its record as not clean, and ingest sends that
record through the per-line path instead, so rejects, their lines and reasons, and every record
built specially stay the normalizers': a value of another type (content parts, numbers), a
missing prompt, an empty user or assistant turn, think tags in an answer, Alpaca's `history`,
`tools`, a turn with more keys than role and content, roles other than user, assistant and
system. The checks are the normalizers' own (`str.isspace`, `"</think>" in`).

Mapped: Alpaca and Evol-CodeAlpaca, OpenOrca, Magicoder (`formats._single_turn` shapes),
ShareGPT and LIMA (`conversations` as `{"from", "value"}` turns or as strings) and OpenAI
`messages`. The rest (OpenAssistant, UltraChat, bare prompts) is per line.

`ENABLED` turns the path off (tests/stages/test_ingest_fast.py compares both paths' outputs).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from workers.stages.ingest import formats as F
from workers.stages.ingest.messages import own_id
from workers.stages.records import MESSAGE_TYPE

ENABLED = True
MIN_RUN = 8  # shorter runs of one key set go per line: their set-up costs more than it saves

SYSTEM, USER, ASSISTANT = 0, 1, 2
_ROLE_NAMES = ("system", "user", "assistant")
# ShareGPT speakers the per-line path maps to these roles (formats.SHAREGPT_ROLES, also lowered)
_SHAREGPT_CODES = {k: _ROLE_NAMES.index(v) for k, v in F.SHAREGPT_ROLES.items()
                   if v in _ROLE_NAMES}
_OPENAI_CODES = {"system": SYSTEM, "developer": SYSTEM, "user": USER, "assistant": ASSISTANT}


class Rows:
    """One run of records with the same keys, read column by column as Python values; a key
    the run lacks reads as None (what `dict.get` gives)."""

    n: int
    keys: frozenset

    def col(self, key: str) -> list:
        raise NotImplementedError


class DictRows(Rows):
    """Parsed JSON objects (every one has exactly `keys`)."""

    def __init__(self, objs: list[dict]):
        self.objs = objs
        self.n = len(objs)
        self.keys = frozenset(objs[0])

    def col(self, key: str) -> list:
        if key not in self.keys:
            return [None] * self.n
        return [o[key] for o in self.objs]


class BatchRows(Rows):
    """A Parquet record batch: the per-line path gets its rows as `batch.to_pylist()`, so
    every column is a key of every row, with the values `to_pylist` gives."""

    def __init__(self, batch: pa.RecordBatch):
        self.batch = batch
        self.n = batch.num_rows
        self.keys = frozenset(batch.schema.names)

    def col(self, key: str) -> list:
        if key not in self.keys:
            return [None] * self.n
        return self.batch.column(key).to_pylist()


def batch_keys_ok(batch: pa.RecordBatch) -> bool:
    names = batch.schema.names
    return len(set(names)) == len(names)


class Built:
    """The clean records of a run: `ok` per input record; for the clean ones in order, their
    own ids and their messages flattened (contents, role codes, a count per record)."""

    def __init__(self, n: int):
        self.ok = np.ones(n, bool)
        self.ids: list = []
        self.contents: list[str] = []
        self.roles: list[int] = []
        self.counts: list[int] = []

    def messages(self) -> pa.Array:
        """The `messages` column (records.MESSAGE_TYPE lists) of the clean records."""
        return _messages(pa.array(self.contents, pa.string()), np.array(self.roles, np.int8),
                         self.counts)

    def id_array(self) -> pa.Array:
        return pa.array(self.ids, pa.string())


class ArrowBuilt(Built):
    """The same, built from Arrow columns without Python strings (`arrow_single_turn`)."""

    def __init__(self, ok: np.ndarray, ids: pa.Array, messages: pa.Array):
        self.ok = ok
        self._ids, self._messages = ids, messages

    def messages(self) -> pa.Array:
        return self._messages

    def id_array(self) -> pa.Array:
        return self._ids


def _messages(contents: pa.Array, roles: np.ndarray, counts) -> pa.Array:
    """list<MESSAGE_TYPE> of flattened messages: contents and role codes in order, a count
    per record."""
    role = _ROLES.take(pa.array(roles, pa.int8()))
    none = pa.nulls(len(contents), pa.string())
    struct = pa.StructArray.from_arrays([role, contents, none, none, none, none],
                                        fields=list(MESSAGE_TYPE))
    offsets = np.zeros(len(counts) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), struct)


_ROLES = pa.array(_ROLE_NAMES, pa.string())


def _ids(rows: Rows, key: str = "id", alt: str | None = None) -> list:
    """`messages.own_id` of `obj.get(key)` (of `obj.get(alt)` where that is None)."""
    vals = rows.col(key)
    if alt is not None and alt in rows.keys:
        vals = [v if v is not None else a for v, a in zip(vals, rows.col(alt))]
    return [v if type(v) is str and v else own_id(v) for v in vals]


def _truthy(rows: Rows, key: str) -> list:
    if key not in rows.keys:
        return [False] * rows.n
    return [bool(v) for v in rows.col(key)]


# -- single-turn formats: [system?, user, assistant?] ------------------------------------------
def _single_turn(n: int, prompts: list, answers: list, systems: list | None, ids: list,
                 odd: list | None = None) -> Built:
    """formats._single_turn per record. A prompt must be a non-blank string (None: NoMatch;
    another type: content parts or a reject); an answer or a system prompt must be a string
    or None (blank ones are left out), an answer without think tags."""
    out = Built(n)
    ok, out_ids = out.ok, out.ids
    content, role, count = out.contents.append, out.roles.append, out.counts.append
    if systems is None:
        systems = [None] * n
    if odd is None:
        odd = [False] * n
    for k, (p, a, s, skip) in enumerate(zip(prompts, answers, systems, odd)):
        if skip or type(p) is not str or not p or p.isspace() or (
                a is not None and (type(a) is not str or "</think>" in a)) or (
                s is not None and type(s) is not str):
            ok[k] = False
            continue
        c = 1
        if s and not s.isspace():
            content(s)
            role(SYSTEM)
            c = 2
        content(p)
        role(USER)
        if a and not a.isspace():
            content(a)
            role(ASSISTANT)
            c += 1
        count(c)
        out_ids.append(ids[k])
    return out


# -- single-turn formats from Parquet text columns, without Python strings --------------------
class Unfit(Exception):
    """A column the Arrow path does not vouch for (neither text nor, for ids, integers; bad
    UTF-8): the batch takes the path through Python values instead."""


_TEXT_TYPES = (pa.string(), pa.large_string(), pa.string_view())
_THINK = re.compile(re.escape(b"</think>"))


def _text(rows: "BatchRows", key: str) -> pa.Array | None:
    """A text column as `pa.string()`; None where the key is absent or the column all-null
    typed (both read as None, as `dict.get` does); another type is Unfit."""
    if key not in rows.keys:
        return None
    arr = rows.batch.column(key)
    if pa.types.is_null(arr.type):
        return None
    if pa.types.is_dictionary(arr.type) and arr.type.value_type in _TEXT_TYPES:
        arr = arr.cast(arr.type.value_type)
    if arr.type not in _TEXT_TYPES:
        raise Unfit(key)
    if arr.type != pa.string():
        arr = arr.cast(pa.string())
    try:
        arr.validate(full=True)  # UTF-8: the other path's to_pylist raises on bad bytes
    except pa.ArrowInvalid:
        raise Unfit(key) from None
    return arr


def _either(rows: "BatchRows", key: str, other: str) -> pa.Array | None:
    """`_first` on text columns."""
    a, b = _text(rows, key), _text(rows, other)
    if a is None or b is None:
        return a if b is None else b
    return pc.coalesce(a, b)


def _bools(mask: pa.Array) -> np.ndarray:
    return mask.fill_null(False).to_numpy(zero_copy_only=False)


def _present(arr: pa.Array | None, n: int) -> np.ndarray:
    """Per row: `s and not s.isspace()`, a non-blank string (Arrow's `utf8_is_space` is
    `str.isspace` on every code point: tests/stages/test_ingest_fast.py)."""
    if arr is None:
        return np.zeros(n, bool)
    return _bools(pc.and_(pc.greater(pc.binary_length(arr), 0),
                          pc.invert(pc.utf8_is_space(arr))))


def _has_think(arr: pa.Array | None, n: int) -> np.ndarray:
    """Per row: `"</think>" in s`; the text buffer is searched whole first (nearly always it
    holds none)."""
    if arr is None or _THINK.search(memoryview(arr.buffers()[2] or b"")) is None:
        return np.zeros(n, bool)
    return _bools(pc.match_substring(arr, "</think>"))


def _id_text(rows: "BatchRows", key: str | None) -> pa.Array | None:
    if key is None or key not in rows.keys:
        return None
    arr = rows.batch.column(key)
    if pa.types.is_integer(arr.type):
        return arr.cast(pa.string())
    return _text(rows, key)


def arrow_ids(rows: "BatchRows", key: str = "id", alt: str | None = None) -> pa.Array:
    """`_ids` as a column: text ids as they are (empty ones null), integer ids in decimal;
    a column of another type goes through `_ids`."""
    try:
        a, b = _id_text(rows, key), _id_text(rows, alt)
    except Unfit:
        return pa.array(_ids(rows, key, alt), pa.string())
    ids = a if b is None else b if a is None else pc.coalesce(a, b)
    if ids is None:
        return pa.nulls(rows.n, pa.string())
    return pc.if_else(pc.greater(pc.binary_length(ids), 0), ids, pa.scalar(None, pa.string()))


def arrow_single_turn(n: int, prompts: pa.Array | None, answers: pa.Array | None,
                      systems: pa.Array | None, ids: pa.Array,
                      odd: np.ndarray | None = None) -> ArrowBuilt:
    """`_single_turn` on text columns in Arrow compute: the same records, the same messages."""
    ok = _present(prompts, n) & ~_has_think(answers, n)
    if odd is not None:
        ok &= ~odd
    parts = np.stack([_present(systems, n) & ok, ok, _present(answers, n) & ok], axis=1)
    at = np.arange(n)
    where = np.stack([at, at + n, at + 2 * n], axis=1)[parts]
    none = pa.nulls(n, pa.string())
    texts = pa.concat_arrays([x if x is not None else none for x in (systems, prompts, answers)])
    roles = np.broadcast_to(np.array([SYSTEM, USER, ASSISTANT], np.int8), (n, 3))[parts]
    messages = _messages(texts.take(pa.array(where)), roles, parts.sum(axis=1)[ok])
    return ArrowBuilt(ok, ids.filter(pa.array(ok)), messages)


def _first(rows: Rows, key: str, other: str) -> list:
    """`obj.get(key)`, or `obj.get(other)` where that is None."""
    vals = rows.col(key)
    if other not in rows.keys:
        return vals
    return [v if v is not None else w for v, w in zip(vals, rows.col(other))]


def alpaca(rows: Rows) -> Built:
    """formats.alpaca: the input follows the instruction after a blank line where it is
    truthy (then both must be strings); `history` sends the record per line."""
    if isinstance(rows, BatchRows):
        try:
            return _arrow_alpaca(rows)
        except Unfit:
            pass
    prompts = rows.col("instruction")
    odd = _truthy(rows, "history")
    if "input" in rows.keys:
        for k, (ins, inp) in enumerate(zip(prompts, rows.col("input"))):
            if inp:
                if type(ins) is str and type(inp) is str:
                    prompts[k] = f"{ins}\n\n{inp}"
                else:
                    odd[k] = True
    return _single_turn(rows.n, prompts, _first(rows, "output", "response"), rows.col("system"),
                        _ids(rows), odd)


def _arrow_alpaca(rows: "BatchRows") -> Built:
    ins, inp = _text(rows, "instruction"), _text(rows, "input")
    odd = np.array(_truthy(rows, "history"), bool)
    if inp is not None:
        given = _bools(pc.greater(pc.binary_length(inp), 0))
        odd |= given if ins is None else given & _bools(ins.is_null())
        if ins is not None:
            ins = pc.if_else(pa.array(given), pc.binary_join_element_wise(ins, inp, "\n\n"), ins)
    return arrow_single_turn(rows.n, ins, _either(rows, "output", "response"),
                             _text(rows, "system"), arrow_ids(rows), odd)


def openorca(rows: Rows) -> Built:
    if isinstance(rows, BatchRows):
        try:
            return arrow_single_turn(rows.n, _text(rows, "question"),
                                     _either(rows, "response", "answer"),
                                     _text(rows, "system_prompt"), arrow_ids(rows))
        except Unfit:
            pass
    return _single_turn(rows.n, rows.col("question"), _first(rows, "response", "answer"),
                        rows.col("system_prompt"), _ids(rows))


def magicoder(rows: Rows) -> Built:
    if isinstance(rows, BatchRows):
        try:
            return arrow_single_turn(rows.n, _text(rows, "problem"), _text(rows, "solution"),
                                     None, arrow_ids(rows, "id", "index"))
        except Unfit:
            pass
    return _single_turn(rows.n, rows.col("problem"), rows.col("solution"), None,
                        _ids(rows, "id", "index"))


# -- conversations ----------------------------------------------------------------------------
Turn = tuple[int, str] | None  # (role code, content) of a plain turn, None for any other


def _conversation(rows: Rows, convs: list, plain: Callable[[Any, int], Turn],
                  systems: list | None, odd: list, ids: list) -> Built:
    """Multi-turn records (formats.sharegpt, formats._openai_messages): a list of plain turns
    in which no user or assistant turn is blank and no assistant turn has think tags; blank
    system turns are dropped; a record needs a user or an assistant turn
    (messages.check_record)."""
    out = Built(rows.n)
    ok, contents, roles, counts, out_ids = out.ok, out.contents, out.roles, out.counts, out.ids
    for k, turns in enumerate(convs):
        s = systems[k] if systems is not None else None
        if odd[k] or type(turns) is not list or (s is not None and type(s) is not str):
            ok[k] = False
            continue
        got = []
        speaking = False
        for i, t in enumerate(turns, 1):
            turn = plain(t, i)
            if turn is None:
                break
            code, text = turn
            if code == SYSTEM:
                if text and not text.isspace():
                    got.append(turn)
                continue
            if not text or text.isspace() or (code == ASSISTANT and "</think>" in text):
                break
            speaking = True
            got.append(turn)
        else:
            if speaking:
                c = 0
                if s is not None and s and not s.isspace():
                    contents.append(s)
                    roles.append(SYSTEM)
                    c = 1
                for code, text in got:
                    contents.append(text)
                    roles.append(code)
                counts.append(c + len(got))
                out_ids.append(ids[k])
                continue
        ok[k] = False
    return out


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


def sharegpt(rows: Rows) -> Built:
    # `conversation` is read where `conversations` is None: such records are not lists of
    # turns here, so they go per line
    key = "conversations" if "conversations" in rows.keys else "conversation"
    return _conversation(rows, rows.col(key), _sharegpt_turn, rows.col("system"),
                         _truthy(rows, "tools"), _ids(rows))


def _openai_turn(t: Any, i: int) -> Turn:
    if type(t) is dict and len(t) == 2:
        role, content = t.get("role"), t.get("content")
        if type(role) is str and type(content) is str:
            code = _OPENAI_CODES.get(role)
            if code is not None:
                return code, content
    return None


def openai(rows: Rows) -> Built:
    return _conversation(rows, rows.col("messages"), _openai_turn, None, _truthy(rows, "tools"),
                         _ids(rows))


MAPPERS: dict[str, Callable[[Rows], Built]] = {
    "alpaca": alpaca, "evol_codealpaca": alpaca, "openorca": openorca, "magicoder": magicoder,
    "sharegpt": sharegpt, "openai": openai}


def mapper(fmt: str | None) -> Callable[[Rows], Built] | None:
    return MAPPERS.get(fmt) if ENABLED and fmt is not None else None
