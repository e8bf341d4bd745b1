"""Stage `ingest`: one source file (any common chat-data format) -> a dataset artifact.

    inputs = {"source": {"path": "<file>", "name": "<dataset name>"?}}
    params = {"format": "auto" | one of formats.FORMATS, "max_reject_share": 0.5,
              "dataset_name": str?, "batch_rows": 4096}

Output: artifact `dataset` (kind `dataset`) at `out_dir/dataset/`: `data.parquet` in the
`records.py` layout, `rejects.jsonl` (one `{"line", "reason"}` per rejected input record) and
`meta.json` (the artifact meta, see `_meta`).

Streaming throughout: lines are parsed one at a time (orjson) and written in row groups of
`batch_rows` by a writer thread, so memory does not grow with the file. Bad records are
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
from itertools import chain
from pathlib import Path
from typing import BinaryIO

import orjson
from contracts.ingest import IngestParams
from contracts.inputs import SourceFile
from workers.stages.common import StageContext, StageError
from workers.stages.ingest.formats import FORMATS, NORMALIZERS, detect_one, shape_hint
from workers.stages.ingest.messages import NoMatch, Reject
from workers.stages.ingest.oasst_flat import FlatTrees
from workers.stages.ingest.readers import Bad, ReaderError, Source
from workers.stages.ingest.writer import ThreadedWriter
from workers.stages.kernel import parse_input, parse_params, publish

__all__ = ["run", "FORMATS"]

DETECT_RECORDS = 64      # objects looked at to pick a file's format
DETECT_MAX_ITEMS = 10_000  # give up detection (binary or foreign file) after this many lines
SAMPLE_REJECTS = 20
PROGRESS_EVERY = 4096

def _validate(spec: dict) -> tuple[IngestParams, SourceFile]:
    return (parse_params(IngestParams, spec.get("params")),
            parse_input(SourceFile, (spec.get("inputs") or {}).get("source"), "inputs.source"))


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


def run(spec: dict, ctx: StageContext) -> dict:
    params, src = _validate(spec)
    path = Path(src.path)
    name = params.dataset_name or src.name or path.name.split(".")[0] or "dataset"
    out = Path(ctx.out_dir) / "dataset"
    out.mkdir(parents=True, exist_ok=True)
    t0, cpu0 = time.monotonic(), time.process_time()
    try:
        source = Source(path, max_inflated_bytes=(spec.get("limits") or {}).get(
            "max_decompressed_bytes"))
    except ReaderError as e:
        raise StageError(e.code, str(e)) from None
    ctx.progress(0, source.total, source.unit, stage="ingest", force=True)

    with source, open(out / "rejects.jsonl", "wb") as rej_fh:
        rejects = _Rejects(rej_fh)
        items = iter(source)
        try:
            head = _read_head(items)
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
        writer = ThreadedWriter(out, name)
        # Parsed JSON is acyclic, so reference counting frees every record; the cyclic GC
        # would only rescan the batches in flight again and again (measured: it doubles the
        # cost of building the Arrow batches). Off for the loop, back on after.
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            lines, per_format = _ingest(chain(head, items), fmt, params, name, source,
                                        writer, rejects, ctx)
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
            "records_per_s": round(writer.count / max(seconds, 1e-9), 1)}


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


def _ingest(items, fmt: str, params: IngestParams, name: str, source: Source,
            writer: ThreadedWriter, rejects: _Rejects, ctx: StageContext) -> tuple[int, Counter]:
    """The hot loop: parse, pick the normalizer, normalize, batch. Returns (input records
    accepted, accepted input records per format)."""
    auto = params.format == "auto"
    fixed = NORMALIZERS[fmt]
    loads, JSONDecodeError = orjson.loads, orjson.JSONDecodeError
    batch_rows = params.batch_rows
    per_format = dict.fromkeys(FORMATS, 0)
    n_items = 0
    batch: list = []
    append = batch.append
    trees = FlatTrees()  # rows of the flat OpenAssistant export, one tree at a time

    def add_records(line: int, rec) -> None:
        if type(rec) is tuple:
            append((line, rec))
        else:  # several records from one input record (OpenAssistant paths)
            for k, r in enumerate(rec):
                append((line, r if r[0] is not None or len(rec) == 1
                        else (f"{name}-{line}-{k}", r[1], r[2])))

    def finished_trees(done) -> None:
        for tline, recs in done:
            if type(recs) is Reject:
                rejects.add(tline, str(recs))
            else:
                per_format["oasst_flat"] += 1
                add_records(tline, recs)

    for line, item in items:
        n_items += 1
        if n_items % PROGRESS_EVERY == 0:
            ctx.progress(source.done(), source.total, source.unit, stage="ingest")
        if type(item) is bytes:
            try:
                obj = loads(item)
            except JSONDecodeError as e:
                rejects.add(line, _diagnose(item, e))
                continue
        elif type(item) is Bad:
            rejects.add(line, item.reason)
            continue
        else:
            obj = item
        if type(obj) is not dict:
            rejects.add(line, f"not a JSON object (a {type(obj).__name__})")
            continue
        if auto:
            # Each record by the format its keys show: a file concatenated from several
            # sources ingests whole (meta["formats"] counts them).
            f = detect_one(obj)
            if f is None:
                rejects.add(line, f"unknown record shape ({shape_hint(obj)})")
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
                rejects.add(line, str(e))
                continue
            except NoMatch:
                rejects.add(line, f"record does not match format {fmt!r} ({shape_hint(obj)})")
                continue
            per_format[f] += 1
            if type(rec) is tuple:
                append((line, rec))
            else:
                add_records(line, rec)
        if len(batch) >= batch_rows:
            writer.submit(batch)
            batch = []
            append = batch.append
    finished_trees(trees.flush())
    writer.submit(batch)
    counts = Counter({k: v for k, v in per_format.items() if v})
    return sum(counts.values()), counts
