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
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from workers.stages.ingest.stats import DatasetStats
from workers.stages.records import MESSAGE_TYPE, SCHEMA, DatasetWriter

_MESSAGES_T = pa.list_(MESSAGE_TYPE)
# Snappy, as HF `datasets` writes, where the other datasets are zstd: an ingested dataset is a
# source's copy on its way to a mix (which writes zstd), and compressing it was a third of
# ingest's CPU. Measured on the scale bench's six sources at 800K records, in one process:
# 8.5 s with zstd, 7.5 s with snappy; the files 50% larger (OpenOrca 67 -> 101 MB at 200K).
COMPRESSION = "snappy"


def _np(arr: pa.Array) -> np.ndarray:
    return arr.to_numpy(zero_copy_only=False)


_P = np.uint64(0x100000001B3)  # odd: invertible modulo 2**64
_P_INV = np.uint64(pow(int(_P), -1, 1 << 64))
_LEN_K = np.uint64(0x9E3779B97F4A7C15)


def _powers(base: np.uint64, m: int) -> np.ndarray:
    """base**0 .. base**(m-1) modulo 2**64."""
    out = np.empty(m, np.uint64)
    if m:
        out[0] = 1
        np.cumprod(np.full(m - 1, base, np.uint64), out=out[1:])
    return out


def id_hashes(ids: pa.Array) -> np.ndarray:
    """A 64-bit hash of each (non-null) string's UTF-8 bytes, vectorized over the Arrow
    buffers: sum(b[j] * P**j) modulo 2**64 (a running sum over the whole buffer, each
    string's slice shifted back by P**-start), plus its length, through murmur3's finalizer.
    Deterministic, so the same file always gives the same ids."""
    n = len(ids)
    if n == 0:
        return np.zeros(0, np.uint64)
    if ids.type != pa.string():
        ids = ids.cast(pa.string())
    offs = np.frombuffer(ids.buffers()[1], np.int32)[ids.offset:ids.offset + n + 1]
    o0 = int(offs[0])
    data = ids.buffers()[2]
    seg = (np.frombuffer(data, np.uint8)[o0:int(offs[-1])] if data is not None
           else np.zeros(0, np.uint8)).astype(np.uint64)
    run = np.zeros(len(seg) + 1, np.uint64)
    np.cumsum(seg * _powers(_P, len(seg)), out=run[1:])
    start = (offs[:-1] - o0).astype(np.int64)
    end = (offs[1:] - o0).astype(np.int64)
    h = (run[end] - run[start]) * _powers(_P_INV, len(seg) + 1)[start]
    h += (end - start).astype(np.uint64) * _LEN_K
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> np.uint64(33)
    return h


class UniqueIds:
    """Keeps ids unique in constant memory: a 16 MiB Bloom filter (two probes from one 64-bit
    hash, `id_hashes`) over the ids given so far. An id that may have been seen (a true
    duplicate, or a false positive, about 1 in 4000 at 2M ids) becomes `<id>#<line>`, unique
    because lines are."""

    def __init__(self, bits: int = 1 << 27):
        self._bits = bytearray(bits >> 3)
        self._mask = bits - 1
        self.renamed = 0

    def many(self, ids: pa.Array, lines: pa.Array) -> pa.Array:
        """Every non-null id in order: renamed when both its bits were set before it, by the
        ids of earlier calls or by an earlier id of this one (a bit's first-seen owner is
        earlier), so calling once or batch by batch gives the same ids
        (tests/stages/test_ingest_fast.py checks)."""
        valid = ids.is_valid()
        given = ids.filter(valid)
        n = len(given)
        if n == 0:
            return ids
        h = id_hashes(given)
        mask = np.uint64(self._mask)
        p, q = h & mask, (h >> np.uint64(32)) & mask
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
    line_arr = pa.array(lines, pa.int64())
    # list<struct> straight from the lists of message tuples: one C++ conversion, no
    # Python-level transpose (measured 20% faster than building the six child arrays).
    messages = pa.array(msgss, _MESSAGES_T)
    return _table(name, line_arr, unique.many(pa.array(own_ids, pa.string()), line_arr),
                  messages, pa.array(tools, pa.string()))


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
        self._writer = DatasetWriter(folder, compression=COMPRESSION)
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
