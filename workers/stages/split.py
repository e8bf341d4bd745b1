"""Stage `split`: one dataset artifact -> `train` and `held_out` dataset artifacts.

    inputs = {"dataset": <resolved dataset artifact>}   (contracts/resolved.py)
    params = {"seed": 0, "share": 0.02, "min_records": 32, "max_records": 500}

A run without an evaluation dataset starts with this stage (contracts/run.py), so generate,
prepare, extract and train read only `train`, and evaluate measures on `held_out`: records
the drafter never saw. Which records are held out depends only on the number of
records and the seed (numpy's generator seeded with [seed, 27]), so a rerun, a retry or the
plan picks the same ones. Both parts keep the dataset's record order; together they are the
input exactly.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from contracts.resolved import SplitResolved
from contracts.split import SplitParams, held_out_count
from workers.stages.common import StageContext, StageError
from workers.stages.ingest.stats import DatasetStats
from workers.stages.kernel import input_error, publish
from workers.stages.records import DATA_FILE, SCHEMA, DatasetWriter, open_parquet


def held_out_mask(records: int, p: SplitParams) -> np.ndarray:
    """True at the positions held out (a seeded choice of `held_out_count` positions)."""
    mask = np.zeros(records, dtype=bool)
    n = held_out_count(records, p)
    if n:
        mask[np.random.default_rng([p.seed, 27]).choice(records, size=n, replace=False)] = True
    return mask


def run(p: SplitParams, inputs: SplitResolved, ctx: StageContext) -> dict:
    t0 = time.monotonic()
    src = Path(inputs.dataset.path)
    if not (src / DATA_FILE).is_file():
        raise input_error("inputs.dataset.path", f"no dataset at {src} (missing {DATA_FILE})")
    pf = open_parquet(src / DATA_FILE)
    total = pf.metadata.num_rows
    mask = held_out_mask(total, p)
    if not mask.any():
        raise StageError("too_few_records", f"the dataset has {total} record(s): none can be "
                         "held out for evaluation; give stages.evaluate.data an evaluation "
                         "dataset, or set the run's evaluation to \"in_sample\"")
    out = Path(ctx.out_dir)
    parts = {"train": (out / "train", DatasetStats()), "held_out": (out / "held_out",
                                                                   DatasetStats())}
    writers = {k: DatasetWriter(folder) for k, (folder, _) in parts.items()}
    try:
        seen = 0
        for batch in pf.iter_batches(batch_size=8192):
            table = pa.Table.from_batches([batch]).cast(SCHEMA)
            held = pa.array(mask[seen:seen + table.num_rows])
            for name, part in (("held_out", table.filter(held)),
                               ("train", table.filter(pc.invert(held)))):
                parts[name][1].update(part)
                writers[name].write_table(part)
            seen += table.num_rows
            ctx.progress(seen, total, "records", stage="split")
    finally:
        for w in writers.values():
            w.close()
    counts = {k: w.count for k, w in writers.items()}
    src_meta = inputs.dataset.meta
    for name, (folder, stats) in parts.items():
        publish(ctx, folder, name, "dataset", {
            "format": src_meta.get("format", "split"), "num_records": counts[name],
            "num_rejected": 0, "rejected_sample": [], "stats": stats.result(),
            "split": {"part": name, "of": str(src), "records": total,
                      "held_out": counts["held_out"], "seed": p.seed}})
    print(f"held out {counts['held_out']} of {total} records (seed {p.seed}); "
          f"{counts['train']} left to train on", flush=True)
    return {"records": total, "held_out": counts["held_out"], "train": counts["train"],
            "seed": p.seed, "seconds": round(time.monotonic() - t0, 3)}
