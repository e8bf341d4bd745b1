"""The tokenized artifact on disk, in the layout `speculators train` reads.

A folder that `datasets.load_from_disk` opens (HF `save_to_disk` layout, torch format set, as
speculators' own `prepare-data` writes it) with one row per kept record, or, for a record the
generate stage answered, one per generated turn whose context the template did not keep
(tokenrows.py; the rows of a record are together, in input order):

    input_ids  list<int64>   the conversation's token ids (rendered, or the target's own)
    loss_mask  list<int64>   1 on the tokens the drafter learns (assistant output), else 0
    seq_len    int64         len(input_ids); speculators' ArrowDataset sorts/packs by it
    id         string        the record id from the dataset (not unique across rows)

next to `token_freq.pt` (token id -> count over masked tokens, speculators'
`save_token_frequency_distribution` format), `d2t-<N>.npy` / `t2d-<N>.npy` when a draft
vocabulary size is set (the names `speculators train --draft-vocab-size N` looks for in its
data path), `rejects.jsonl` and `prepare_meta.json`.

Rows stream into an Arrow IPC file in the job's scratch folder while workers produce them;
`finish` turns it into the `save_to_disk` layout with datasets' public API.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa

SCHEMA = pa.schema([
    ("input_ids", pa.list_(pa.int64())),
    ("loss_mask", pa.list_(pa.int64())),
    ("seq_len", pa.int64()),
    ("id", pa.string()),
])


def rows_to_batch(ids: list[str], input_ids: list[np.ndarray], loss_masks: list[np.ndarray]
                  ) -> pa.RecordBatch:
    """Build a record batch from per-row arrays without a per-token Python loop."""
    lens = np.fromiter((len(x) for x in input_ids), dtype=np.int64, count=len(input_ids))
    offsets = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])

    def lists(parts: list[np.ndarray]) -> pa.ListArray:
        flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=pa.int64()))

    return pa.RecordBatch.from_arrays(
        [lists(input_ids), lists(loss_masks), pa.array(lens), pa.array(ids, type=pa.string())],
        schema=SCHEMA)


class TokenizedWriter:
    """Streams record batches to scratch, then writes the `save_to_disk` folder."""

    def __init__(self, folder: Path, scratch: Path):
        self.folder = Path(folder)
        self.scratch = Path(scratch)
        self.scratch.mkdir(parents=True, exist_ok=True)
        self._path = self.scratch / "rows.arrow"
        self._sink = pa.OSFile(str(self._path), "wb")
        self._writer = pa.ipc.new_stream(self._sink, SCHEMA)
        self.num_rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self._writer.write_batch(batch)
            self.num_rows += batch.num_rows

    def finish(self, max_shard_size: str | int = "500MB") -> None:
        from datasets import Dataset

        self._writer.close()
        self._sink.close()
        ds = Dataset.from_file(str(self._path))
        # speculators' ArrowDataset compares rows to hidden-state token ids with torch.equal,
        # so rows must come back as tensors: the format is saved with the data.
        ds.set_format(type="torch")
        self.folder.mkdir(parents=True, exist_ok=True)
        ds.save_to_disk(str(self.folder), max_shard_size=max_shard_size)
        del ds
        shutil.rmtree(self.scratch, ignore_errors=True)

    def abort(self) -> None:
        try:
            self._writer.close()
            self._sink.close()
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)


def length_percentiles(lengths: np.ndarray) -> dict[str, float]:
    if len(lengths) == 0:
        return {}
    q = np.percentile(lengths, [50, 90, 99])
    return {"p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]),
            "max": int(lengths.max()), "mean": float(lengths.mean())}
