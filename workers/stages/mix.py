"""Stage `mix`: several dataset artifacts -> one, with weights, caps, dedupe and lineage.

    inputs = {"sources": [{"path": <dataset dir>, "dataset_id": str, "name": str?,
                           "weight": float? (default 1.0), "max_records": int?}, ...]}
    params = {"dedupe": true, "seed": 0, "max_records": null}

What a source contributes, in order:
 1. dedupe (when on): a record whose normalized prompt was already seen, in an earlier source
    or earlier in the same one, is dropped. The prompt is the messages before the first
    assistant turn (all of them for a prompt-only record), each as role + content with runs
    of whitespace collapsed to one space; compared by a 64-bit blake2b digest (collisions are
    negligible below billions of records). `u` = the records left.
 2. weight `w` scales how many records it gives: `taken = floor(w * u + 0.5)`, capped by the
    source's `max_records`. `taken <= u` is a uniform sample without replacement; `w > 1`
    repeats every record `taken // u` times plus a sample of `taken % u` (upsampling; the
    copies get `#<k>` id suffixes and are not dropped as duplicates).
 3. `params.max_records` caps the total: the per-source counts are scaled down in proportion
    (largest remainder), then sampled as in 2.

Order: a seeded random interleaving of the sources (each source keeps its records in their
stored order). Everything random comes from `seed` (numpy SeedSequence [seed, source index]),
so the same inputs and seed give the same dataset byte for byte, and another seed another
sample and order.

Ids become `<prefix>/<source id>` where prefix is the source's name (else its dataset_id;
made unique, `/` replaced), so they stay unique; `source` keeps the original
`<dataset name>:<line>` for lineage. Memory: one batch per source, plus 8 bytes per input
record for the dedupe digests (a uint64 array; `np.unique` sorts a copy with its index: 24
bytes per input record at that moment), 8 per unique record kept for the write phase and 1
per output record for the order.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from contracts.mix import MixParams
from contracts.resolved import MixResolved, ResolvedDataset
from workers.stages.common import StageContext
from workers.stages.kernel import input_error, publish
from workers.stages.ingest.stats import DatasetStats
from workers.stages.records import DATA_FILE, SCHEMA, DatasetWriter, open_parquet

BATCH_ROWS = 8192  # output row groups
# Rows read at a time from each source: six sources are open at once in the write phase, so
# their batches are most of the stage's memory (8192-row batches of long records: ~200 MB).
READ_ROWS = 2048


def _check(sources: list[ResolvedDataset]) -> None:
    for i, s in enumerate(sources):
        if not (Path(s.path) / DATA_FILE).is_file():
            raise input_error(f"inputs.sources.{i}.path", f"no dataset at {s.path} "
                              f"(missing {DATA_FILE})")


def _prefixes(sources: list[ResolvedDataset]) -> list[str]:
    out: list[str] = []
    for i, s in enumerate(sources):
        p = (s.name or s.dataset_id or f"source{i}").replace("/", "_")
        base, k = p, 1
        while p in out:
            k += 1
            p = f"{base}.{k}"
        out.append(p)
    return out


def prompt_digests(messages: pa.ListArray) -> np.ndarray:
    """uint64 digest of each record's normalized prompt (see the module doc)."""
    off = messages.offsets.to_numpy()
    off = off - off[0]
    role, content = messages.flatten().flatten()[:2]
    roles, contents = role.to_pylist(), content.to_pylist()
    out = np.empty(len(messages), dtype=np.uint64)
    blake = hashlib.blake2b
    for r in range(len(messages)):
        parts = []
        for j in range(off[r], off[r + 1]):
            if roles[j] == "assistant":
                break
            parts.append(f"{roles[j]}\x1f{' '.join((contents[j] or '').split())}")
        out[r] = int.from_bytes(blake("\x1e".join(parts).encode(), digest_size=8).digest(), "little")
    return out


def _kept_rows(paths: list[Path], dedupe: bool, ctx: StageContext) -> tuple[list[int], list[np.ndarray]]:
    """Rows per source that survive dedupe (first occurrence wins, sources in order)."""
    sizes = [pq.ParquetFile(p / DATA_FILE).metadata.num_rows for p in paths]
    if not dedupe:
        return sizes, [np.arange(n, dtype=np.int64) for n in sizes]
    total = sum(sizes)
    digests = np.empty(total, dtype=np.uint64)
    pos = 0
    for p in paths:
        for batch in open_parquet(p / DATA_FILE).iter_batches(batch_size=READ_ROWS,
                                                             columns=["messages"]):
            d = prompt_digests(batch.column(0))
            digests[pos:pos + len(d)] = d
            pos += len(d)
            ctx.progress(pos, total, "records", stage="dedupe")
    _, first = np.unique(digests, return_index=True)
    keep = np.zeros(total, dtype=bool)
    keep[first] = True
    kept, start = [], 0
    for n in sizes:
        kept.append(np.flatnonzero(keep[start:start + n]))
        start += n
    return sizes, kept


def _scale_down(counts: list[int], cap: int) -> list[int]:
    """Counts scaled to sum to `cap`, by largest remainder (ties: the earlier source)."""
    total = sum(counts)
    if total <= cap:
        return counts
    exact = [c * cap / total for c in counts]
    out = [math.floor(x) for x in exact]
    order = sorted(range(len(counts)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[:cap - sum(out)]:
        out[i] += 1
    return out


def _passes(kept: np.ndarray, taken: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Sorted row indices per pass over the source: full passes, then a sample."""
    u = len(kept)
    if taken == 0 or u == 0:
        return []
    full, rest = divmod(taken, u)
    passes = [kept] * full
    if rest:
        passes.append(np.sort(rng.choice(kept, size=rest, replace=False)))
    return passes


class _Stream:
    """The selected rows of one source, in order, as tables of the output schema."""

    def __init__(self, path: Path, passes: list[np.ndarray], prefix: str):
        self._it = self._pieces(path, passes, prefix)
        self._buf: list[pa.Table] = []
        self._have = 0

    @staticmethod
    def _pieces(path: Path, passes: list[np.ndarray], prefix: str) -> Iterator[pa.Table]:
        for k, sel in enumerate(passes):
            head = pa.scalar(f"{prefix}/")
            tail = pa.scalar(f"#{k}" if k else "")
            start = 0
            for batch in open_parquet(path / DATA_FILE).iter_batches(batch_size=READ_ROWS):
                n = batch.num_rows
                lo, hi = np.searchsorted(sel, [start, start + n])
                start += n
                if lo == hi:
                    continue
                t = pa.Table.from_batches([batch]).take(pa.array(sel[lo:hi] - (start - n)))
                ids = pc.binary_join_element_wise(head, t.column("id"), tail, "")
                yield t.set_column(t.schema.get_field_index("id"), "id", ids)

    def take(self, n: int) -> pa.Table:
        while self._have < n:
            t = next(self._it)
            self._buf.append(t)
            self._have += t.num_rows
        t = pa.concat_tables(self._buf)
        out, rest = t.slice(0, n), t.slice(n)
        self._buf, self._have = ([rest] if rest.num_rows else []), rest.num_rows
        return out


def run(params: MixParams, inputs: MixResolved, ctx: StageContext) -> dict:
    sources = inputs.sources
    _check(sources)
    t0 = time.monotonic()
    paths = [Path(s.path) for s in sources]
    prefixes = _prefixes(sources)

    sizes, kept = _kept_rows(paths, params.dedupe, ctx)
    wanted = []
    for s, rows in zip(sources, kept):
        w = 1.0 if s.weight is None else s.weight
        n = math.floor(w * len(rows) + 0.5)
        wanted.append(n if s.max_records is None else min(n, s.max_records))
    taken = _scale_down(wanted, params.max_records) if params.max_records else wanted
    passes = [_passes(rows, n, np.random.default_rng([params.seed, i]))
              for i, (rows, n) in enumerate(zip(kept, taken))]
    # The interleaving: which source each output record comes from, shuffled (the smallest
    # integer type that holds the source index: 1 byte per output record, not 8).
    labels = np.random.default_rng([params.seed, len(sources), 7]).permutation(
        np.repeat(np.arange(len(sources), dtype=np.min_scalar_type(len(sources))), taken))

    out = Path(ctx.out_dir) / "dataset"
    out.mkdir(parents=True, exist_ok=True)
    stats = DatasetStats()
    streams = [_Stream(p, ps, px) for p, ps, px in zip(paths, passes, prefixes)]
    total = len(labels)
    with DatasetWriter(out) as writer:
        for c0 in range(0, total, BATCH_ROWS):
            chunk = labels[c0:c0 + BATCH_ROWS]
            counts = np.bincount(chunk, minlength=len(sources))
            parts = [streams[i].take(int(n)) for i, n in enumerate(counts) if n]
            grouped = pa.concat_tables(parts)  # rows grouped by source, in source order
            # place each source's rows at the positions its label holds in the chunk
            idx = np.empty(len(chunk), dtype=np.int64)
            idx[np.argsort(chunk, kind="stable")] = np.arange(len(chunk))
            table = grouped.take(pa.array(idx)).cast(SCHEMA)
            stats.update(table)
            writer.write_table(table)
            ctx.progress(c0 + len(chunk), total, "records", stage="write")

    lineage = [{"dataset_id": s.dataset_id, "name": s.name, "prefix": px, "path": s.path,
                "weight": 1.0 if s.weight is None else s.weight, "max_records": s.max_records,
                "records": n, "unique": len(rows), "duplicates_dropped": n - len(rows),
                "taken": t, "repeats": max(0, len(ps) - 1)}
               for s, px, n, rows, t, ps in zip(sources, prefixes, sizes, kept, taken, passes)]
    meta = {"format": "mix", "num_records": total, "num_rejected": 0, "rejected_sample": [],
            "sources": lineage, "dedupe": params.dedupe, "seed": params.seed,
            "max_records": params.max_records, "stats": stats.result()}
    publish(ctx, out, "dataset", "dataset", meta)
    return {"num_records": total, "sources": len(sources),
            "duplicates_dropped": sum(x["duplicates_dropped"] for x in lineage),
            "seconds": round(time.monotonic() - t0, 3)}
