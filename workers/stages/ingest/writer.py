"""Record batches -> Arrow tables -> `records.DatasetWriter`, the Parquet encoding on a thread.

Ingest hands over its records in pieces, in input order: lists of `(line, record)` pairs from
the per-line path (`submit`) and columns from the vectorized path (`submit_columns`, fast.py).
Each piece becomes an Arrow table (ids made unique, in order) in the calling thread; once
`batch_rows` records wait they go out as one row group (statistics updated, queued) and a
writer thread encodes and compresses it. Only that last part releases the GIL, so only it runs
on the thread: measured on 200 MB, building the tables on the writer thread as well made them
twice as slow (both threads wanted the GIL) and left the parser waiting on a full queue for 40%
of the run.
"""

from __future__ import annotations

import queue
import threading
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from workers.stages.ingest.stats import DatasetStats
from workers.stages.records import MESSAGE_TYPE, SCHEMA, DatasetWriter

_MESSAGES_T = pa.list_(MESSAGE_TYPE)


def _np(arr: pa.Array) -> np.ndarray:
    return arr.to_numpy(zero_copy_only=False)


class UniqueIds:
    """Keeps ids unique in constant memory: a 16 MiB Bloom filter (two probes) over the ids
    given so far. An id that may have been seen (a true duplicate, or a false positive, about
    1 in 4000 at 2M ids) becomes `<id>#<line>`, unique because lines are. crc32 rather than
    `hash()` (randomized per process) so that the same file always gives the same ids."""

    def __init__(self, bits: int = 1 << 27):
        self._bits = bytearray(bits >> 3)
        self._mask = bits - 1
        self.renamed = 0

    def __call__(self, rid: str, line: int) -> str:
        b = rid.encode()
        h1 = zlib.crc32(b)
        h2 = zlib.crc32(b, 0x9E3779B9)
        p, q = h1 & self._mask, (h2 ^ (h1 << 7)) & self._mask
        bits = self._bits
        i, m, j, n = p >> 3, 1 << (p & 7), q >> 3, 1 << (q & 7)
        if bits[i] & m and bits[j] & n:
            self.renamed += 1
            return f"{rid}#{line}"
        bits[i] |= m
        bits[j] |= n
        return rid

    def many(self, ids: pa.Array, lines: pa.Array) -> pa.Array:
        """`self(rid, line)` for every non-null id in order, vectorized: an id is renamed
        when both its bits were set before it, by the ids before this call or by an earlier
        id of this call (its first-seen owner is earlier). The same hashes, so the same ids
        as calling one by one (tests/stages/test_ingest_fast.py checks)."""
        valid = ids.is_valid()
        given = ids.filter(valid)
        n = len(given)
        if n == 0:
            return ids
        crc32 = zlib.crc32
        raw = given.cast(pa.binary()).to_pylist()
        h1 = np.fromiter((crc32(b) for b in raw), np.uint64, n)
        h2 = np.fromiter((crc32(b, 0x9E3779B9) for b in raw), np.uint64, n)
        mask = np.uint64(self._mask)
        p, q = h1 & mask, (h2 ^ (h1 << np.uint64(7))) & mask
        bits = np.frombuffer(self._bits, np.uint8)
        seven, three = np.uint64(7), np.uint64(3)

        def was_set(b: np.ndarray) -> np.ndarray:
            return ((bits[(b >> three).astype(np.int64)] >> (b & seven).astype(np.uint8)) & 1
                    ).astype(bool)

        # earlier in this call: the first id that sets a bit owns it
        pos = np.concatenate([p, q])
        owner = np.tile(np.arange(n), 2)
        order = np.lexsort((owner, pos))
        sp = pos[order]
        head = np.empty(len(sp), bool)
        head[0] = True
        np.not_equal(sp[1:], sp[:-1], out=head[1:])
        first = np.empty(len(sp), np.int64)
        first[order] = owner[order][head][np.cumsum(head) - 1]
        k = np.arange(n)
        renamed = (was_set(p) | (first[:n] < k)) & (was_set(q) | (first[n:] < k))
        np.bitwise_or.at(bits, (pos >> three).astype(np.int64),
                         np.left_shift(1, (pos & seven).astype(np.uint8)).astype(np.uint8))
        if not renamed.any():
            return ids
        self.renamed += int(renamed.sum())
        out = ids.to_pylist()
        at = np.flatnonzero(_np(valid))[renamed]
        line_at = _np(pc.take(lines, pa.array(at)))
        for i, line in zip(at.tolist(), line_at.tolist()):
            out[i] = f"{out[i]}#{line}"
        return pa.array(out, pa.string())


def build_table(name: str, batch: list, unique: UniqueIds) -> pa.Table:
    """`batch` is [(line, (own_id | None, [Msg, ...], tools | None)), ...]. Transposes are
    C-level (zip); it runs in the parsing thread (it needs the GIL throughout)."""
    lines, recs = zip(*batch)
    own_ids, msgss, tools = zip(*recs)
    ids = list(own_ids)
    for k, rid in enumerate(ids):
        if rid is not None:
            ids[k] = unique(rid, lines[k])
    # list<struct> straight from the lists of message tuples: one C++ conversion, no
    # Python-level transpose (measured 20% faster than building the six child arrays).
    messages = pa.array(msgss, _MESSAGES_T)
    return _table(name, pa.array(lines, pa.int64()), pa.array(ids, pa.string()), messages,
                  pa.array(tools, pa.string()))


def columns_table(name: str, lines: pa.Array, own_ids: pa.Array, messages: pa.Array,
                  tools: pa.Array, unique: UniqueIds) -> pa.Table:
    """The same table from columns (fast.py): `own_ids` null where the record has none."""
    return _table(name, lines, unique.many(own_ids, lines), messages, tools)


def _table(name: str, lines: pa.Array, ids: pa.Array, messages: pa.Array,
           tools: pa.Array) -> pa.Table:
    str_t = pa.string()
    line_str = pc.cast(lines, str_t)
    source = pc.binary_join_element_wise(pa.scalar(f"{name}:"), line_str, "")
    fallback = pc.binary_join_element_wise(pa.scalar(f"{name}-"), line_str, "")
    return pa.Table.from_arrays([pc.coalesce(ids, fallback), source, messages, tools],
                                schema=SCHEMA)


class ThreadedWriter:
    """`submit(batch)` / `submit_columns(...)` from the reading thread; `close()` flushes and
    re-raises any error of the writer thread. Row groups of `batch_rows` records (a piece
    larger than that is one row group); at most `depth` of them wait, which bounds memory.
    One: the fast path produces row groups about as fast as the thread writes them, so a
    deeper queue was simply full, 12 MB more per waiting row group of long records at the
    peak, for no throughput (measured on the scale bench's sources)."""

    def __init__(self, folder: Path, name: str, batch_rows: int = 4096, depth: int = 1):
        self.name = name
        self.batch_rows = batch_rows
        self.stats = DatasetStats()
        self.count = 0
        self.unique = UniqueIds()
        self._pieces: list[pa.Table] = []
        self._waiting = 0
        self._writer = DatasetWriter(folder)
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="ingest-writer", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            table = self._q.get()
            if table is None:
                return
            if self._error is not None:
                continue  # drain so the producer never blocks on a dead writer
            try:
                self._writer.write_table(table)
            except BaseException as e:  # noqa: BLE001  re-raised in the producer thread
                self._error = e

    def submit(self, batch: list) -> None:
        """Records of the per-line path: [(line, (own_id | None, [Msg, ...], tools)), ...]."""
        if batch:
            self._add(build_table(self.name, batch, self.unique))

    def submit_columns(self, lines: pa.Array, own_ids: pa.Array, messages: pa.Array,
                       tools: pa.Array) -> None:
        """Records of the vectorized path, as columns (`lines` int64)."""
        if len(lines):
            self._add(columns_table(self.name, lines, own_ids, messages, tools, self.unique))

    def _add(self, table: pa.Table) -> None:
        if self._error is not None:
            raise self._error
        self._pieces.append(table)
        self._waiting += table.num_rows
        if self._waiting >= self.batch_rows:
            self._flush()

    def _flush(self) -> None:
        if not self._pieces:
            return
        pieces, self._pieces, self._waiting = self._pieces, [], 0
        table = pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)
        self.stats.update(table)
        self.count += table.num_rows
        self._q.put(table)

    def close(self) -> None:
        """Finish writing. Safe to call twice; raises the writer thread's error if any."""
        if self._thread.is_alive():
            try:
                if self._error is None:
                    self._flush()
            finally:
                self._q.put(None)
                self._thread.join()
                self._writer.close()
        if self._error is not None:
            raise self._error
