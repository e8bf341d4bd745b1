"""Stage `ingest`: one source file (any common chat-data format) -> a dataset artifact.

    inputs = {"source": {"path": "<file>", "name": "<dataset name>"?}}
    params = {"format": "auto" | one of formats.FORMATS, "max_reject_share": 0.5,
              "dataset_name": str?, "batch_rows": 4096}

Output: artifact `dataset` (kind `dataset`) at `out_dir/dataset/`: `data.parquet` in the
`records.py` layout, `rejects.jsonl` (one `{"line", "reason"}` per rejected input record) and
`meta.json` (the artifact meta, see `_meta`).

Streaming throughout: lines are parsed one at a time (orjson) and written in row groups of
`batch_rows` by a writer thread, so memory does not grow with the file. Blocks of `FAST_ROWS`
input records (Parquet: record batches) go through fast.py first: runs of records with one
key set in a flat format become columns (one Arrow conversion per run), and only the records
it cannot vouch for take the per-line path (`_Records.per_line`), which decides everything
about them as it always did (tests/stages/test_ingest_fast.py: both paths give the same
artifact). Bad records are
rejected with their line and a reason, never fatal; the whole ingest fails only when the file
cannot be read, no known format is found, or more than `max_reject_share` of the input records
are rejected.

Format detection is per file: the most common format among the first records that parse
(`DETECT_RECORDS`). With `format="auto"` a record of another known shape is still normalized by
its own format (a file concatenated from several sources ingests whole) and counted in
`meta["formats"]`; with a forced format it is rejected.
"""

from __future__ import annotations

import gc
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from itertools import chain, islice
from pathlib import Path
from typing import BinaryIO

import numpy as np
import orjson
import pyarrow as pa

from contracts.ingest import IngestParams
from contracts.resolved import IngestResolved
from workers.stages.common import StageContext, StageError
from workers.stages.ingest import fast
from workers.stages.ingest.formats import FORMATS, NORMALIZERS, detect_one, shape_hint
from workers.stages.ingest.messages import NoMatch, Reject
from workers.stages.ingest.oasst_flat import FlatTrees
from workers.stages.ingest.readers import Bad, ReaderError, Source
from workers.stages.ingest.writer import ThreadedWriter
from workers.stages.kernel import publish

__all__ = ["run", "FORMATS"]

DETECT_RECORDS = 64      # objects looked at to pick a file's format
DETECT_MAX_ITEMS = 10_000  # give up detection (binary or foreign file) after this many lines
SAMPLE_REJECTS = 20
PROGRESS_EVERY = 4096
BLOCK_BYTES = 64 << 20  # JSON text (or Parquet batch) the fast path takes at once, at most
# Records the fast path takes at once (row groups are still batch_rows records): with 4096,
# the parsed block, its columns and the tables queued for the writer made the peak RSS of
# an 800K-record ingest 35-50 MB higher than the per-line path's, and the main thread
# slower (measured on the scale bench's Evol-CodeAlpaca and OpenOrca files).
FAST_ROWS = 1024

class _Rejects:
    """Writes every reject to rejects.jsonl; keeps a sample and reason counts for the meta."""

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self.count = 0
        self.sample: list[dict] = []
        self.kinds: Counter = Counter()

    def add(self, line: int, reason: str) -> None:
        reason = reason if len(reason) <= 300 else reason[:297] + "..."
        rec = {"line": line, "reason": reason}
        self._fh.write(orjson.dumps(rec) + b"\n")
        self.count += 1
        if len(self.sample) < SAMPLE_REJECTS:
            self.sample.append(rec)
        kind = re.sub(r"\d+", "N", reason.split(":")[0].split(" (")[0])[:80]
        if kind in self.kinds or len(self.kinds) < 50:
            self.kinds[kind] += 1


_TEXT_BYTES = bytes([9, 10, 12, 13]) + bytes(range(32, 256))


def _diagnose(raw: bytes, err: Exception) -> str:
    """Why a line does not parse, in words a user can act on."""
    raw = raw.rstrip(b"\r\n")
    head = raw[:4096]
    if b"\x00" in head or len(head.translate(None, _TEXT_BYTES)) > len(head) // 10:
        return f"binary data ({len(raw)} bytes), not a JSON record"
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"non-UTF-8 bytes at byte {e.start} (0x{raw[e.start]:02x}); the file must be UTF-8"
    return f"invalid JSON: {err}"


def _detect(head: list, objs_out: list) -> tuple[str | None, Counter]:
    """Most common format among the first objects that parse (ties: the first seen)."""
    seen: Counter = Counter()
    for _line, item in head:
        if type(item) is bytes:
            try:
                item = orjson.loads(item)
            except orjson.JSONDecodeError:
                continue
        if type(item) is dict:
            objs_out.append(item)
            fmt = detect_one(item)
            if fmt is not None:
                seen[fmt] += 1
    return (seen.most_common(1)[0][0] if seen else None), seen


def run(params: IngestParams, inputs: IngestResolved, ctx: StageContext) -> dict:
    src = inputs.source
    path = Path(src.path)
    name = params.dataset_name or src.name or path.name.split(".")[0] or "dataset"
    out = Path(ctx.out_dir) / "dataset"
    out.mkdir(parents=True, exist_ok=True)
    t0, cpu0 = time.monotonic(), time.process_time()
    try:
        source = Source(path, max_inflated_bytes=ctx.limits.get("max_decompressed_bytes"))
    except ReaderError as e:
        raise StageError(e.code, str(e)) from None
    ctx.progress(0, source.total, source.unit, stage="ingest", force=True)

    with source, open(out / "rejects.jsonl", "wb") as rej_fh:
        rejects = _Rejects(rej_fh)
        try:
            head, body = _open_items(source, params.batch_rows)
        except ReaderError as e:
            raise StageError(e.code, str(e)) from None
        fmt: str = params.format
        if fmt == "auto":
            objs: list = []
            detected, _ = _detect(head, objs)
            if detected is None:
                what = (f"none of the first {len(objs)} records has a known shape "
                        f"({shape_hint(objs[0])})" if objs else
                        f"no JSON object in the first {len(head)} records")
                raise StageError("ingest_failed",
                                 f"{path.name}: unknown format: {what}; known formats: "
                                 f"{', '.join(FORMATS)} (force one: --format in the CLI, "
                                 f"the form field or params.format in the API)")
            fmt = detected
        writer = ThreadedWriter(out, name, params.batch_rows)
        # Parsed JSON is acyclic, so reference counting frees every record; the cyclic GC
        # would only rescan the batches in flight again and again (measured: it doubles the
        # cost of building the Arrow batches). Off for the loop, back on after.
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            lines, per_format, vectorized = _ingest(body, fmt, params, name, source, writer,
                                                    rejects, ctx)
        except ReaderError as e:
            raise StageError(e.code, str(e)) from None
        finally:
            try:
                writer.close()
            finally:
                if gc_was_on:
                    gc.enable()

    considered = lines + rejects.count
    if considered == 0:
        raise StageError("ingest_failed", f"{path.name} holds no records")
    share = rejects.count / considered
    if share > params.max_reject_share:
        top = "; ".join(f"{k} x{v}" for k, v in rejects.kinds.most_common(5))
        raise StageError(
            "too_many_rejects",
            f"{rejects.count} of {considered} records rejected ({share:.0%} > "
            f"max_reject_share {params.max_reject_share:.0%}); most common: {top}",
            {"num_rejected": rejects.count, "num_lines": considered,
             "rejected_sample": rejects.sample, "reasons": dict(rejects.kinds.most_common(10))})

    seconds = time.monotonic() - t0
    meta = {
        "format": fmt,
        "formats": dict(per_format),
        "container": source.container,
        "compression": source.compression,
        "source": {"path": str(path), "name": name},
        "num_records": writer.count,
        "num_lines": considered,
        "num_rejected": rejects.count,
        "rejected_sample": rejects.sample,
        "reject_reasons": dict(rejects.kinds.most_common(10)),
        "duplicate_ids": writer.unique.renamed,
        "stats": writer.stats.result(),
    }
    ctx.progress(source.total, source.total, source.unit, stage="ingest", force=True)
    if writer.unique.renamed:
        ctx.warning(f"{writer.unique.renamed} records repeat an earlier id; "
                    "they got `<id>#<line>` ids")
    publish(ctx, out, "dataset", "dataset", meta)
    mb = path.stat().st_size / 1e6
    return {"format": fmt, "num_records": writer.count, "num_rejected": rejects.count,
            "seconds": round(seconds, 3), "cpu_seconds": round(time.process_time() - cpu0, 3),
            "mb_per_s": round(mb / max(seconds, 1e-9), 2),
            "records_per_s": round(writer.count / max(seconds, 1e-9), 1),
            "vectorized_records": vectorized}


def _open_items(source: Source, batch_rows: int) -> tuple[list, Iterator]:
    """(the first items, for format detection; everything to ingest, those included). With
    the fast path on, a Parquet source is read as record batches (the head as rows still)."""
    if not (fast.ENABLED and source.container == "parquet"):
        items = iter(source)
        head = _read_head(items)
        return head, chain(head, items)
    batches = source.parquet_batches(min(FAST_ROWS, batch_rows))
    first: list = []
    rows = 0
    for line, batch in batches:
        first.append((line, batch))
        rows += batch.num_rows
        if rows >= DETECT_RECORDS:
            break
    head = list(enumerate(chain.from_iterable(b.to_pylist() for _, b in first), 1))
    return head[:DETECT_RECORDS], chain(first, batches)


def _read_head(items) -> list:
    head = []
    objs = 0
    for line, item in items:
        head.append((line, item))
        if type(item) is not Bad:
            objs += 1
        if objs >= DETECT_RECORDS or len(head) >= DETECT_MAX_ITEMS:
            break
    return head


class _Records:
    """What both paths share: the records batch of the per-line path, the OpenAssistant rows
    of the tree being read, the per-format counts and the writer. `per_line()` is the
    per-line path; `columns()` takes the records of the fast path (fast.py), in input order
    with the per-line ones."""

    def __init__(self, fmt: str, params: IngestParams, name: str, writer: ThreadedWriter,
                 rejects: _Rejects) -> None:
        self.fmt = fmt
        self.auto = params.format == "auto"
        self.fixed = NORMALIZERS[fmt]
        self.batch_rows = params.batch_rows
        self.name = name
        self.writer = writer
        self.rejects = rejects
        self.per_format = dict.fromkeys(FORMATS, 0)
        self.batch: list = []
        self.trees = FlatTrees()  # rows of the flat OpenAssistant export, one tree at a time
        self.vectorized = 0  # input records that took the fast path

    def add_records(self, line: int, rec) -> None:
        append, name = self.batch.append, self.name
        if type(rec) is tuple:
            append((line, rec))
        else:  # several records from one input record (OpenAssistant paths)
            for k, r in enumerate(rec):
                append((line, r if r[0] is not None or len(rec) == 1
                        else (f"{name}-{line}-{k}", r[1], r[2])))

    def finished_trees(self, done) -> None:
        for tline, recs in done:
            if type(recs) is Reject:
                self.rejects.add(tline, str(recs))
            else:
                self.per_format["oasst_flat"] += 1
                self.add_records(tline, recs)

    def per_line(self, items) -> None:
        """The per-line path over `(line, item)` pairs, an item being raw bytes, a `Bad`
        reason or an already decoded value: parse, pick the normalizer, normalize, batch.
        (The hot loop of files the fast path does not take: names are bound locally.)"""
        auto, fmt, fixed = self.auto, self.fmt, self.fixed
        per_format, trees, finished_trees = self.per_format, self.trees, self.finished_trees
        add_reject, batch_rows, writer = self.rejects.add, self.batch_rows, self.writer
        loads, JSONDecodeError = orjson.loads, orjson.JSONDecodeError
        batch = self.batch
        append = batch.append
        for line, item in items:
            if type(item) is bytes:
                try:
                    obj = loads(item)
                except JSONDecodeError as e:
                    add_reject(line, _diagnose(item, e))
                    continue
            elif type(item) is Bad:
                add_reject(line, item.reason)
                continue
            else:
                obj = item
            if type(obj) is not dict:
                add_reject(line, f"not a JSON object (a {type(obj).__name__})")
                continue
            if auto:
                # Each record by the format its keys show: a file concatenated from several
                # sources ingests whole (meta["formats"] counts them).
                f = detect_one(obj)
                if f is None:
                    add_reject(line, f"unknown record shape ({shape_hint(obj)})")
                    continue
                norm = NORMALIZERS[f]
            else:
                f, norm = fmt, fixed
            if f == "oasst_flat":
                finished_trees(trees.add(line, obj))
            else:
                if trees.pending:
                    finished_trees(trees.flush())
                try:
                    rec = norm(obj)
                except Reject as e:
                    add_reject(line, str(e))
                    continue
                except NoMatch:
                    add_reject(line, f"record does not match format {fmt!r} ({shape_hint(obj)})")
                    continue
                per_format[f] += 1
                if type(rec) is tuple:
                    append((line, rec))
                else:
                    self.add_records(line, rec)
            if len(batch) >= batch_rows:
                writer.submit(batch)
                batch = self.batch = []
                append = batch.append

    def columns(self, fmt: str, lines: pa.Array, ids: pa.Array, messages: pa.Array) -> None:
        """Records of format `fmt` (one per input record) built by fast.py."""
        if self.trees.pending:  # as per_line() does before any record of another format
            self.finished_trees(self.trees.flush())
        self.writer.submit(self.batch)
        self.batch = []
        self.writer.submit_columns(lines, ids, messages, pa.nulls(len(lines), pa.string()))
        self.per_format[fmt] += len(lines)
        self.vectorized += len(lines)

    def run(self, fmt: str, mapper, rows: fast.Rows, lines: np.ndarray, item) -> None:
        """A run of input records with the same keys (fast.py): the clean ones as columns,
        the others per line (`item(k)` is the k-th record as `per_line()` takes it), in
        input order."""
        built = mapper(rows)
        ok = built.ok
        bad = np.flatnonzero(~ok)
        if len(bad) == rows.n:
            ids = messages = pa.nulls(0)
        else:
            ids, messages = built.id_array(), built.messages()
        line_arr = pa.array(lines)
        start = done = 0
        for b in (*bad.tolist(), rows.n):
            if b > start:
                k = b - start
                self.columns(fmt, line_arr.slice(start, k), ids.slice(done, k),
                             messages.slice(done, k))
                done += k
            if b < rows.n:
                self.per_line(((int(lines[b]), item(b)),))
            start = b + 1

    def finish(self) -> tuple[int, Counter, int]:
        self.finished_trees(self.trees.flush())
        self.writer.submit(self.batch)
        self.batch = []
        counts = Counter({k: v for k, v in self.per_format.items() if v})
        return sum(counts.values()), counts, self.vectorized

    def format_of(self, obj: dict) -> str | None:
        return detect_one(obj) if self.auto else self.fmt


def _ingest(items, fmt: str, params: IngestParams, name: str, source: Source,
            writer: ThreadedWriter, rejects: _Rejects, ctx: StageContext,
            ) -> tuple[int, Counter, int]:
    """The hot loop. Returns (input records accepted, accepted input records per format,
    input records that took the fast path).
    `items`: `(line, item)` pairs, or for Parquet with the fast path on, `(first line,
    RecordBatch)` pairs."""
    recs = _Records(fmt, params, name, writer, rejects)
    if not fast.ENABLED:
        items = iter(items)
        while _per_line_chunk(recs, items, PROGRESS_EVERY):
            ctx.progress(source.done(), source.total, source.unit, stage="ingest")
    elif source.container == "parquet":
        for first, batch in items:
            _batch(recs, first, batch)
            ctx.progress(source.done(), source.total, source.unit, stage="ingest")
    else:
        _json_items(recs, items, min(FAST_ROWS, params.batch_rows), lambda: ctx.progress(
            source.done(), source.total, source.unit, stage="ingest"))
    return recs.finish()


def _take_block(items: Iterator, rows: int) -> list:
    """The next up to `rows` items, and about BLOCK_BYTES of JSON at most (a block is held
    whole, parsed, by the fast path)."""
    block: list = []
    size = 0
    for it in items:
        block.append(it)
        if type(it[1]) is bytes:
            size += len(it[1])
        if len(block) >= rows or size >= BLOCK_BYTES:
            break
    return block


def _per_line_chunk(recs: _Records, items: Iterator, rows: int) -> bool:
    """The next up to `rows` items through the per-line path, streamed; False at the end."""
    first = next(items, None)
    if first is None:
        return False
    recs.per_line(chain((first,), islice(items, rows - 1)))
    return True


PER_LINE_WINDOW = 64  # records parsed ahead of the per-line path at most (kept in cache)
RETRY_EVERY = 8  # after blocks without a fast run, only every 8th block looks for runs


def _json_items(recs: _Records, items, rows: int, progress: Callable[[], None]) -> None:
    """JSON items in blocks of up to `rows` records (and about BLOCK_BYTES of JSON). A file
    whose blocks have no run for the fast path (every record of another shape than the one
    before, say) goes per line, looking for runs again every RETRY_EVERY blocks."""
    items = iter(items)
    misses = k = 0
    while True:
        if misses >= 2 and k % RETRY_EVERY:
            if not _per_line_chunk(recs, items, rows):
                return
        else:
            block = _take_block(items, rows)
            if not block:
                return
            before = recs.vectorized
            _block(recs, block)
            misses = 0 if recs.vectorized > before else misses + 1
        progress()
        k += 1


def _block(recs: _Records, block: list) -> None:
    """JSON items, parsed here one by one. A run of objects with the same keys (so one format:
    detect_one reads keys, up to the mapped formats) of at least fast.MIN_RUN records in a
    mapped format goes to the fast path; the other records go to the per-line path a few at a
    time, soon after they were parsed (a line that does not parse is handed over as its bytes,
    so the per-line path diagnoses it)."""
    loads, JSONDecodeError = orjson.loads, orjson.JSONDecodeError
    min_run = fast.MIN_RUN
    got: list = []  # (line, parsed object, or the bytes of a line that does not parse)
    done = start = 0  # handed over: got[:done]; the current run: got[start:]
    keys = None

    def end_run(stop: int) -> None:
        nonlocal done
        if keys is not None and stop - start >= min_run:
            f = recs.format_of(got[start][1])
            mapper = fast.mapper(f)
            if mapper is not None:
                if done < start:
                    recs.per_line(got[done:start])
                run = [obj for _, obj in got[start:stop]]
                recs.run(f, mapper, fast.DictRows(run),
                         np.fromiter((line for line, _ in got[start:stop]), np.int64,
                                     stop - start), run.__getitem__)
                done = stop
                return
        if stop - done >= PER_LINE_WINDOW:
            recs.per_line(got[done:stop])
            done = stop

    for i, (line, item) in enumerate(block):
        if type(item) is bytes:
            try:
                obj = loads(item)
            except JSONDecodeError:
                obj = item
        else:
            obj = item
        got.append((line, obj))
        if keys is None or type(obj) is not dict or obj.keys() != keys:
            if i - start >= min_run or i - done >= PER_LINE_WINDOW:
                end_run(i)
            start = i
            keys = obj.keys() if type(obj) is dict else None
    end_run(len(got))
    if done < len(got):
        recs.per_line(got[done:])


def _batch(recs: _Records, first: int, batch: pa.RecordBatch) -> None:
    """Parquet rows: every row has every column as a key, so the batch is one run."""
    n = batch.num_rows
    lines = np.arange(first, first + n, dtype=np.int64)
    f = recs.format_of(dict.fromkeys(batch.schema.names))
    mapper = fast.mapper(f)
    if mapper is None or not fast.batch_keys_ok(batch) or batch.nbytes > BLOCK_BYTES:
        recs.per_line(enumerate(batch.to_pylist(), first))
        return
    pylist: list | None = None

    def row_at(k: int) -> dict:  # the rows the per-line path gets, made if one is needed
        nonlocal pylist
        if pylist is None:
            pylist = batch.to_pylist()
        return pylist[k]
    recs.run(f, mapper, fast.BatchRows(batch), lines, row_at)  # type: ignore[arg-type]
