"""Test helpers for dataset folders: write records as a dataset, recompute its statistics.
The stages write datasets while streaming (workers/stages/records.DatasetWriter) and keep
statistics as they go (workers/stages/ingest/stats.DatasetStats); these are the tests' and
the benches' one-call versions."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from workers.stages.ingest.stats import DatasetStats
from workers.stages.records import DATA_FILE, DatasetWriter, open_parquet


def write_dataset(folder: Path | str, records: Iterable[dict]) -> int:
    """Write `records` as a dataset folder; returns how many were written."""
    with DatasetWriter(folder) as w:
        for r in records:
            w.write(r)
    return w.count


def dataset_stats(folder: str | Path, batch_rows: int = 8192) -> dict:
    """Statistics of a dataset folder, recomputed from its rows."""
    st = DatasetStats()
    pf = open_parquet(Path(folder) / DATA_FILE)
    for batch in pf.iter_batches(batch_size=batch_rows, columns=["messages", "tools"]):
        st.update(batch)
    return st.result()
