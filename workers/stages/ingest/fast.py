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

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

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
        m = len(self.contents)
        content = pa.array(self.contents, pa.string())
        role = _ROLES.take(pa.array(np.array(self.roles, np.int8)))
        none = pa.nulls(m, pa.string())
        struct = pa.StructArray.from_arrays([role, content, none, none, none, none],
                                            fields=list(MESSAGE_TYPE))
        offsets = np.zeros(len(self.counts) + 1, np.int32)
        np.cumsum(self.counts, out=offsets[1:])
        return pa.ListArray.from_arrays(pa.array(offsets), struct)

    def id_array(self) -> pa.Array:
        return pa.array(self.ids, pa.string())


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


def _first(rows: Rows, key: str, other: str) -> list:
    """`obj.get(key)`, or `obj.get(other)` where that is None."""
    vals = rows.col(key)
    if other not in rows.keys:
        return vals
    return [v if v is not None else w for v, w in zip(vals, rows.col(other))]


def alpaca(rows: Rows) -> Built:
    """formats.alpaca: the input follows the instruction after a blank line where it is
    truthy (then both must be strings); `history` sends the record per line."""
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


def openorca(rows: Rows) -> Built:
    return _single_turn(rows.n, rows.col("question"), _first(rows, "response", "answer"),
                        rows.col("system_prompt"), _ids(rows))


def magicoder(rows: Rows) -> Built:
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
