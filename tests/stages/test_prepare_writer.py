"""prepare's TokenizedWriter: the `save_to_disk` folder written while streaming."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.stages.prepare_support import rows_to_batch
from workers.stages.prepare.writer import TokenizedWriter

REPO = Path(__file__).resolve().parents[2]


def _batches(n_batches: int, rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for b in range(n_batches):
        ids = [f"r{b}-{i}" for i in range(rows)]
        toks = [rng.integers(0, 1000, size=int(rng.integers(1, 40))) for _ in range(rows)]
        masks = [(t % 2).astype(np.int64) for t in toks]
        yield rows_to_batch(ids, toks, masks)


def _rows(batches) -> list[dict]:
    out = []
    for b in batches:
        out += b.to_pylist()
    return out


def test_shards_roll_at_max_size_and_load_back_identically(tmp_path):
    from datasets import Dataset, load_from_disk

    batches = list(_batches(12, 20))
    folder = tmp_path / "tok"
    w = TokenizedWriter(folder, max_shard_size=3 * batches[0].nbytes)
    for b in batches:
        w.write(b)
    names = w.finish()
    assert len(names) == 4 and w.num_rows == 240
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [*names, "dataset_info.json", "state.json"])  # no .part left
    assert names[0] == "data-00000-of-00004.arrow"

    ds = load_from_disk(str(folder))
    assert ds.format["type"] == "torch"  # speculators compares rows with torch.equal
    assert ds.with_format(None).to_list() == _rows(batches)
    assert type(ds[5]["input_ids"]).__name__ == "Tensor"

    # the files datasets' own save_to_disk writes, but for the shard list and fingerprint
    ref = tmp_path / "ref"
    d = Dataset.from_list(_rows(batches))
    d = d.cast(ds.features)
    d.set_format(type="torch")
    d.save_to_disk(str(ref), num_shards=4)
    assert json.loads((folder / "dataset_info.json").read_text()) == \
        json.loads((ref / "dataset_info.json").read_text())
    mine, theirs = (json.loads((f / "state.json").read_text()) for f in (folder, ref))
    mine.pop("_fingerprint"), theirs.pop("_fingerprint")
    assert mine == theirs


def test_abort_leaves_no_partial_shard(tmp_path):
    folder = tmp_path / "tok"
    w = TokenizedWriter(folder, max_shard_size=1)
    for b in _batches(3, 5):
        w.write(b)
    w.abort()
    assert list(folder.iterdir()) == []


def test_empty_writer_gives_an_empty_loadable_set(tmp_path):
    from datasets import load_from_disk

    w = TokenizedWriter(tmp_path / "tok")
    w.finish()
    assert len(load_from_disk(str(tmp_path / "tok"))) == 0


RSS_CHILD = r"""
import resource, sys
import numpy as np
sys.path.insert(0, sys.argv[3])
from tests.stages.prepare_support import rows_to_batch
from workers.stages.prepare.writer import TokenizedWriter
n_batches = int(sys.argv[2])
toks = [np.arange(4096, dtype=np.int64)] * 128            # 4 MiB of input_ids a batch
ids = [str(i) for i in range(128)]
batch = rows_to_batch(ids, toks, toks)                   # 8 MiB a batch
w = TokenizedWriter(sys.argv[1], max_shard_size="64MB")
w.write(batch)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for _ in range(n_batches - 1):
    w.write(batch)
w.finish()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)
"""


def _peak_growth_kb(folder: Path, n_batches: int) -> int:
    p = subprocess.run([sys.executable, "-c", RSS_CHILD, str(folder), str(n_batches), str(REPO)],
                       capture_output=True, text=True, check=True)
    return int(p.stdout.split()[-1])


def test_peak_rss_does_not_grow_with_the_rows(tmp_path):
    """8 MiB batches: 4 (32 MiB) vs 40 (320 MiB, 6 shards of 64 MB). Writing the whole set to a
    scratch file and saving it with save_to_disk memory-mapped all of it (RSS +320 MiB here)."""
    small = _peak_growth_kb(tmp_path / "small", 4)
    big = _peak_growth_kb(tmp_path / "big", 40)
    assert len(list((tmp_path / "big").glob("data-*.arrow"))) > 4
    assert big - small < 64 * 1024, (small, big)


def test_rows_travel_narrow_and_are_written_int64_exactly():
    """Workers send ids as uint32 and masks as uint8 when they fit (pool.ChunkResult); ids
    that do not fit travel as they are. Either way the batch is the int64 rows."""
    from workers.stages.prepare.pool import _narrow
    from workers.stages.prepare.writer import SCHEMA, flat_to_batch

    ids = np.array([0, 151_668, 2**32 - 1, 5], dtype=np.int64)
    mask = np.array([0, 1, 1, 0], dtype=np.int64)
    assert _narrow(ids, np.uint32).dtype == np.uint32
    assert _narrow(mask, np.uint8).dtype == np.uint8
    big = np.array([1, 2**32], dtype=np.int64)
    assert _narrow(big, np.uint32).dtype == np.int64          # does not fit: as it is
    assert _narrow(np.array([-1]), np.uint32).dtype != np.uint32
    lengths = np.array([1, 3], dtype=np.int64)
    for a, b in ((ids, mask), (_narrow(ids, np.uint32), _narrow(mask, np.uint8))):
        batch = flat_to_batch(["x", "y"], lengths, a, b)
        assert batch.schema == SCHEMA
        assert batch.to_pylist() == [
            {"input_ids": [0], "loss_mask": [0], "seq_len": 1, "id": "x"},
            {"input_ids": [151_668, 2**32 - 1, 5], "loss_mask": [1, 1, 0], "seq_len": 3,
             "id": "y"}]
