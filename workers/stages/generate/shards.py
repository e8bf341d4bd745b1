"""Resumable output of the generate stage.

Finished records (answered or failed) are written to `work_dir/generate/shards/` in parquet
shards keyed by record id, the pieces of a `kernel.ShardSet`: each renamed into place when
complete, so a killed attempt leaves only whole shards. A restart reads the ids of the
shards and skips them. The artifact is
assembled from the shards at the end: `data.parquet` (records.py layout) and
`token_ids.parquet`; the stage's FailureLog (failures.py) lists the failed records.

A fingerprint of what decides the output (input paths, params, backend) is kept beside the
shards; shards made under another fingerprint are discarded rather than mixed in.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from workers.stages.kernel import ShardSet
from workers.stages.records import (
    MESSAGE_TYPE,
    TOKEN_IDS_FILE,
    DatasetWriter,
    from_row,
    open_parquet,
    to_row,
)

TURN_TYPE = pa.struct([
    ("turn", pa.int32()),  # index of the assistant message in the output record
    ("prompt_ids", pa.list_(pa.int32())),
    ("completion_ids", pa.list_(pa.int32())),
    ("finish_reason", pa.string()),
])
SHARD_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("source", pa.string()),
    ("messages", pa.list_(MESSAGE_TYPE)),
    ("tools", pa.string()),
    ("index", pa.int64()),  # position in the input dataset
    ("failure", pa.string()),  # reason code, null when the record was answered
    ("failure_detail", pa.string()),
    ("turns", pa.list_(TURN_TYPE)),
])
TOKEN_IDS_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("turn", pa.int32()),
    ("prompt_ids", pa.list_(pa.int32())),
    ("completion_ids", pa.list_(pa.int32())),
    ("finish_reason", pa.string()),
])
FAILURES_FILE = "failures.jsonl"


def fingerprint_of(obj: dict) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


class ShardStore:
    """Record shards `shard-<seq>.parquet` in sequence order, over one `ShardSet`."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self.dir = self.root / "shards"
        self.pieces = ShardSet(self.dir, self.root / "fingerprint.json", "shard-", ".parquet")

    def open(self, fingerprint: str) -> bool:
        """Prepare the store for this fingerprint; False when old shards were discarded."""
        return self.pieces.open({"fingerprint": fingerprint})

    def shards(self) -> list[Path]:
        return list(self.pieces.done().values())

    def done(self) -> tuple[set[str], int]:
        """(ids of finished records, how many of them failed), from the shards' small columns."""
        ids: set[str] = set()
        failed = 0
        for p in self.shards():
            t = pq.read_table(p, columns=["id", "failure"])
            new = [(i, f) for i, f in zip(t.column("id").to_pylist(),
                                          t.column("failure").to_pylist()) if i not in ids]
            ids.update(i for i, _ in new)
            failed += sum(f is not None for _, f in new)
        return ids, failed

    def write(self, rows: list[dict]) -> Path | None:
        """Atomically add one shard (rows as `shard_row` gives them)."""
        if not rows:
            return None
        seq = max(self.pieces.done(), default=-1) + 1
        table = pa.Table.from_pylist(rows, schema=SHARD_SCHEMA)
        return self.pieces.commit(
            seq, lambda tmp: pq.write_table(table, tmp, compression="zstd"), width=6,
            fsync=True)

    def failed_rows(self) -> Iterator[dict]:
        """{"id", "source", "failure", "failure_detail"} of the failed records in the shards
        (an earlier attempt's failures, for the failure list of a resumed one)."""
        cols = ["id", "source", "failure", "failure_detail"]
        for p in self.shards():
            for row in pq.read_table(p, columns=cols).to_pylist():
                if row["failure"] is not None:
                    yield row

    def iter_rows(self) -> Iterator[dict]:
        for p in self.shards():
            for batch in open_parquet(p).iter_batches(batch_size=1024):
                yield from batch.to_pylist()


def shard_row(index: int, record: dict, failure: str | None = None,
              failure_detail: str | None = None, turns: list[dict] | None = None) -> dict:
    row = to_row(record)
    row.update(index=index, failure=failure, failure_detail=failure_detail, turns=turns or [])
    return row


@dataclass
class Assembled:
    num_records: int = 0
    num_failed: int = 0
    failed_by_reason: dict = field(default_factory=dict)
    tokens_generated: int = 0
    prompt_tokens: int = 0
    turns_generated: int = 0
    finish_reasons: dict = field(default_factory=dict)
    ids: set = field(default_factory=set)


def assemble(store: ShardStore, folder: Path | str) -> Assembled:
    """Write the data files from the shards; each id once (the first shard wins)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = Assembled()
    failed: Counter = Counter()
    finishes: Counter = Counter()
    data = DatasetWriter(folder)
    tok_writer = pq.ParquetWriter(folder / TOKEN_IDS_FILE, TOKEN_IDS_SCHEMA, compression="zstd")
    tok_buf: list[dict] = []

    def flush_tokens() -> None:
        if tok_buf:
            tok_writer.write_table(pa.Table.from_pylist(tok_buf, schema=TOKEN_IDS_SCHEMA))
            tok_buf.clear()

    try:
        for row in store.iter_rows():
            if row["id"] in out.ids:
                continue
            out.ids.add(row["id"])
            if row["failure"] is not None:  # listed by the stage's FailureLog
                failed[row["failure"]] += 1
                continue
            data.write(from_row(row))
            for t in row["turns"]:
                tok_buf.append({"id": row["id"], **t})
                out.tokens_generated += len(t["completion_ids"])
                out.prompt_tokens += len(t["prompt_ids"])
                finishes[t["finish_reason"]] += 1
            if len(tok_buf) >= 1024:
                flush_tokens()
        flush_tokens()
    finally:
        data.close()
        tok_writer.close()
    out.num_records = data.count
    out.num_failed = sum(failed.values())
    out.failed_by_reason = dict(failed)
    out.turns_generated = sum(finishes.values())
    out.finish_reasons = dict(finishes)
    return out
