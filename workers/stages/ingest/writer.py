"""Record batches -> Arrow tables -> `records.DatasetWriter`, the Parquet encoding on a thread.

Ingest appends one `(line, record)` pair per record; every `batch_rows` records `submit` turns
the batch into an Arrow table (ids made unique, statistics updated) in the calling thread and
queues it; a writer thread encodes and compresses it into the next row group. Only that last
part releases the GIL, so only it runs on the thread: measured on 200 MB, building the
tables on the writer thread as well made them twice as slow (both threads wanted the GIL) and
left the parser waiting on a full queue for 40% of the run.
"""

from __future__ import annotations

import queue
import threading
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from workers.stages.ingest.stats import DatasetStats
from workers.stages.records import MESSAGE_TYPE, SCHEMA, DatasetWriter

_MESSAGES_T = pa.list_(MESSAGE_TYPE)


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


def build_table(name: str, batch: list, unique: UniqueIds) -> pa.Table:
    """`batch` is [(line, (own_id | None, [Msg, ...], tools | None)), ...]. Transposes are
    C-level (zip); it runs in the parsing thread (it needs the GIL throughout)."""
    str_t = pa.string()
    lines, recs = zip(*batch)
    own_ids, msgss, tools = zip(*recs)
    ids = list(own_ids)
    for k, rid in enumerate(ids):
        if rid is not None:
            ids[k] = unique(rid, lines[k])
    # list<struct> straight from the lists of message tuples: one C++ conversion, no
    # Python-level transpose (measured 20% faster than building the six child arrays).
    messages = pa.array(msgss, _MESSAGES_T)
    line_str = pc.cast(pa.array(lines, pa.int64()), str_t)
    source = pc.binary_join_element_wise(pa.scalar(f"{name}:"), line_str, "")
    fallback = pc.binary_join_element_wise(pa.scalar(f"{name}-"), line_str, "")
    id_arr = pc.coalesce(pa.array(ids, str_t), fallback)
    return pa.Table.from_arrays([id_arr, source, messages, pa.array(tools, str_t)], schema=SCHEMA)


class ThreadedWriter:
    """`submit(batch)` from the reading thread; `close()` flushes and re-raises any error
    of the writer thread. At most `depth` batches wait, which bounds memory."""

    def __init__(self, folder: Path, name: str, depth: int = 2):
        self.name = name
        self.stats = DatasetStats()
        self.count = 0
        self.unique = UniqueIds()
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
        if self._error is not None:
            raise self._error
        if batch:
            table = build_table(self.name, batch, self.unique)
            self.stats.update(table)
            self.count += table.num_rows
            self._q.put(table)

    def close(self) -> None:
        """Finish writing. Safe to call twice; raises the writer thread's error if any."""
        if self._thread.is_alive():
            self._q.put(None)
            self._thread.join()
            self._writer.close()
        if self._error is not None:
            raise self._error
