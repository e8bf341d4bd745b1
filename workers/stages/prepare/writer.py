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

Rows stream straight into the folder's shards while workers produce them, as `save_to_disk`
writes them (datasets' own `ArrowWriter`: Arrow IPC stream files with the features in the schema
metadata), a new shard once the next batch would pass `max_shard_size`. The shard count is
known only at the end, so shards are written as `.shard-<i>.arrow.part` and `finish` renames
them to `data-<i>-of-<N>.arrow` and writes `state.json` and `dataset_info.json`. Memory stays
one batch whatever the number of rows (the earlier scratch file + `Dataset.from_file` +
`save_to_disk` memory-mapped the whole set: 4.7 GB of RSS at 800K records).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

SCHEMA = pa.schema([
    ("input_ids", pa.list_(pa.int64())),
    ("loss_mask", pa.list_(pa.int64())),
    ("seq_len", pa.int64()),
    ("id", pa.string()),
])
# datasets' `save_to_disk` default (config.MAX_SHARD_SIZE)
MAX_SHARD_SIZE = "500MB"


def flatten_rows(input_ids: list[np.ndarray], loss_masks: list[np.ndarray]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lengths, ids end to end, masks end to end) of per-row arrays."""
    lens = np.fromiter((len(x) for x in input_ids), dtype=np.int64, count=len(input_ids))
    empty = np.zeros(0, dtype=np.int64)
    return (lens, np.concatenate(input_ids) if input_ids else empty,
            np.concatenate(loss_masks) if loss_masks else empty)


def flat_to_batch(ids: list[str], lengths: np.ndarray, flat_ids: np.ndarray,
                  flat_mask: np.ndarray) -> pa.RecordBatch:
    """A record batch from the rows' lengths and their ids and masks end to end, of any
    integer width (workers send them as uint32 and uint8: 5 bytes a token through the pipe
    instead of 16); written int64, as speculators writes them."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    pa_offsets = pa.array(offsets)

    def lists(flat: np.ndarray) -> pa.ListArray:
        return pa.ListArray.from_arrays(pa_offsets, pa.array(flat.astype(np.int64, copy=False)))

    return pa.RecordBatch.from_arrays(
        [lists(flat_ids), lists(flat_mask), pa.array(lengths.astype(np.int64, copy=False)),
         pa.array(ids, type=pa.string())], schema=SCHEMA)


class TokenizedWriter:
    """Streams record batches into the `save_to_disk` folder's shards (see the module doc)."""

    def __init__(self, folder: Path, max_shard_size: str | int = MAX_SHARD_SIZE):
        from datasets.utils.py_utils import convert_file_size_to_int

        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_shard_size = convert_file_size_to_int(max_shard_size)
        self.num_rows = 0
        self.shard_rows: list[int] = []
        self._parts: list[Path] = []
        self._writer = None
        self._shard_bytes = 0

    def _roll(self) -> None:
        from datasets.arrow_writer import ArrowWriter

        self._close_shard()
        part = self.folder / f".shard-{len(self._parts):05d}.arrow.part"
        self._parts.append(part)
        self.shard_rows.append(0)
        self._writer = ArrowWriter(features=_features(), path=str(part))
        self._shard_bytes = 0

    def _close_shard(self) -> None:
        if self._writer is not None:
            self._writer.finalize()
            self._writer.close()
            self._writer = None

    def write(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        if self._writer is None or (self._shard_bytes and
                                    self._shard_bytes + batch.nbytes > self.max_shard_size):
            self._roll()
        assert self._writer is not None
        self._writer.write_table(pa.Table.from_batches([batch]))
        self._shard_bytes += batch.nbytes
        self.shard_rows[-1] += batch.num_rows
        self.num_rows += batch.num_rows

    def finish(self) -> list[str]:
        """Close the last shard, give the shards their final names, write the state and info
        files `Dataset.load_from_disk` reads. Returns the shard file names."""
        from datasets.utils.py_utils import asdict

        if self._writer is None:
            self._roll()  # no rows: one empty shard, as save_to_disk writes
        self._close_shard()
        n = len(self._parts)
        names = [f"data-{i:05d}-of-{n:05d}.arrow" for i in range(n)]
        for part, name in zip(self._parts, names):
            part.rename(self.folder / name)
        self._parts = []
        fingerprint = hashlib.blake2b(json.dumps([self.num_rows, self.shard_rows]).encode(),
                                      digest_size=8).hexdigest()
        # speculators' ArrowDataset compares rows to hidden-state token ids with torch.equal,
        # so rows must come back as tensors: the format is saved with the data.
        state: dict[str, Any] = {
            "_data_files": [{"filename": x} for x in names], "_fingerprint": fingerprint,
            "_format_columns": None, "_format_kwargs": {}, "_format_type": "torch",
            "_output_all_columns": False, "_split": None}
        (self.folder / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
        info = asdict(_info())
        (self.folder / "dataset_info.json").write_text(
            json.dumps({k: info[k] for k in sorted(info)}, indent=2))
        return names

    def abort(self) -> None:
        try:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        finally:
            for part in self._parts:
                part.unlink(missing_ok=True)
            self._parts = []


def _features():
    from datasets import Features  # imported only when a writer is made (heavy)

    return Features.from_arrow_schema(SCHEMA)


def _info():
    from datasets import DatasetInfo

    return DatasetInfo(features=_features())


def length_percentiles(lengths: np.ndarray) -> dict[str, float]:
    if len(lengths) == 0:
        return {}
    q = np.percentile(lengths, [50, 90, 99])
    return {"p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]),
            "max": int(lengths.max()), "mean": float(lengths.mean())}
