"""The streaming stages' memory does not grow with their records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from workers.stages.records import DATA_FILE, SCHEMA, DatasetWriter, open_parquet

REPO = Path(__file__).resolve().parents[2]
MB = 1 << 20


def _table(n: int, chars: int, seed: int) -> pa.Table:
    """n records of a user turn and an assistant turn of about `chars` random (hardly
    compressible) characters each."""
    rng = np.random.default_rng(seed)
    text = rng.integers(0, 1 << 62, size=(n, 2, chars // 16), dtype=np.int64)
    msgs = [[{"role": "user", "content": f"{i} " + t[0].tobytes().hex()},
             {"role": "assistant", "content": t[1].tobytes().hex()}] for i, t in enumerate(text)]
    return pa.table({"id": [f"s{seed}-{i}" for i in range(n)],
                     "source": [f"src:{i}" for i in range(n)],
                     "messages": msgs, "tools": [None] * n}, schema=SCHEMA)


def _dataset(folder: Path, n: int, seed: int, chars: int = 1000, rows_per_group: int = 1000
             ) -> Path:
    with DatasetWriter(folder) as w:
        for start in range(0, n, rows_per_group):
            w.write_table(_table(min(rows_per_group, n - start), chars,
                                 seed * 1_000_003 + start))
    return folder


class _PeakArrow:
    """Peak of pyarrow's allocated bytes, sampled on a thread (and on demand)."""

    def __init__(self):
        self.base = pa.total_allocated_bytes()
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> None:
        self.peak = max(self.peak, pa.total_allocated_bytes() - self.base)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(0.002)

    def __enter__(self) -> "_PeakArrow":
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()


def test_open_parquet_holds_a_batch_not_the_file(tmp_path):
    """pyarrow's default pre-buffering kept the column chunks of every row group read so
    far: after iterating a 24 MB file it held ~24 MB, and a 4x file 4x that."""
    folder = _dataset(tmp_path / "d", 24_000, seed=1)
    assert (folder / DATA_FILE).stat().st_size > 20 * MB
    with _PeakArrow() as peak:
        for batch in open_parquet(folder / DATA_FILE).iter_batches(batch_size=500):
            peak.sample()
            del batch
    assert peak.peak < 8 * MB, peak.peak / MB


def _mix_spec(tmp: Path, sources: list[Path]) -> dict:
    return {"inputs": {"sources": [{"path": str(p), "name": p.name} for p in sources]},
            "params": {"dedupe": True, "seed": 0}, "out_dir": str(tmp / "out"),
            "work_dir": str(tmp / "work")}


def test_mix_arrow_memory_is_flat_in_the_records(tmp_path):
    """The same two-source mix at 12K and 48K records per source (3 and 12 output chunks):
    the peak of Arrow memory in use (the readers' batches, the output chunk) does not grow
    with the files."""
    from workers.stages import mix
    from workers.stages.common import StageContext

    peaks = []
    for n in (12_000, 48_000):
        base = tmp_path / f"n{n}"
        srcs = [_dataset(base / f"src{k}", n, seed=10 * n + k, chars=300) for k in range(2)]
        spec = _mix_spec(base, srcs)
        with _PeakArrow() as peak:
            mix.run(spec, StageContext.from_spec(spec))
        peaks.append(peak.peak)
    assert peaks[1] < 1.25 * peaks[0] + 4 * MB, [p / MB for p in peaks]


def test_streaming_stages_get_the_lean_allocators(tmp_path):
    """`python -m workers.stages` sets the system Arrow pool and a fixed mmap threshold for
    the streaming stages before pyarrow loads (workers/stages/memory.py)."""
    code = ("import os, sys\n"
            "import workers.stages.__main__ as m\n"
            "rc = m.main(['mix', '--spec', sys.argv[1]])\n"
            "import pyarrow as pa\n"
            "print(rc, pa.default_memory_pool().backend_name, "
            "os.environ.get('MALLOC_MMAP_THRESHOLD_'))\n")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(_mix_spec(tmp_path, [_dataset(tmp_path / "d", 10, seed=0)])))
    env = {k: v for k, v in os.environ.items()
           if k not in ("ARROW_DEFAULT_MEMORY_POOL", "MALLOC_MMAP_THRESHOLD_")}
    p = subprocess.run([sys.executable, "-c", code, str(spec)], cwd=REPO, env=env,
                       check=True, capture_output=True, text=True)
    assert p.stdout.split()[-3:] == ["0", "system", str(1 << 20)], p.stdout + p.stderr


MAPPED_CHILD = r"""
import ctypes, json, os, sys
import workers.stages.__main__ as m
rc = m.main([sys.argv[1], '--spec', sys.argv[2]])


class MallInfo2(ctypes.Structure):  # glibc >= 2.33
    _fields_ = [(k, ctypes.c_size_t) for k in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
mapped = {}
for mib in (2, 8):  # is a fresh block of this size mapped on its own, or from the heap?
    before = libc.mallinfo2().hblks
    p = libc.malloc(mib << 20)
    mapped[mib] = libc.mallinfo2().hblks > before
    libc.free(ctypes.c_void_p(p))
print(json.dumps({"rc": rc, "mapped": mapped, "env": {k: os.environ.get(k) for k in (
    "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")}}))
"""


def test_ingest_gets_its_own_malloc_thresholds(tmp_path):
    """Ingest's 1-4 MiB batch buffers come from the heap (a 4 MiB mmap threshold, a 32 MiB trim
    threshold: memory.py measured a quarter of its CPU in page faults at 1 MiB); mix keeps
    the 1 MiB threshold that keeps its RSS flat. Checked on malloc itself, after the stage ran
    in a process whose environment named no thresholds (as a warm starter's child's)."""
    src = tmp_path / "src.jsonl"
    src.write_text("".join(json.dumps({"instruction": f"q{i}", "output": f"a{i}"}) + "\n"
                           for i in range(20)))
    ingest_spec = tmp_path / "ingest.json"
    ingest_spec.write_text(json.dumps({
        "inputs": {"source": {"path": str(src), "name": "src"}}, "params": {},
        "out_dir": str(tmp_path / "out"), "work_dir": str(tmp_path / "work"),
        "events_path": str(tmp_path / "events.jsonl")}))
    mix_spec = tmp_path / "mix.json"
    mix_spec.write_text(json.dumps(_mix_spec(tmp_path / "m", [_dataset(tmp_path / "d", 10, 0)])))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    got = {}
    for stage, spec in (("ingest", ingest_spec), ("mix", mix_spec)):
        p = subprocess.run([sys.executable, "-c", MAPPED_CHILD, stage, str(spec)], cwd=REPO,
                           env=env, check=True, capture_output=True, text=True)
        got[stage] = json.loads(p.stdout.splitlines()[-1])
    assert got["ingest"] == {"rc": 0, "mapped": {"2": False, "8": True}, "env": {
        "MALLOC_MMAP_THRESHOLD_": str(4 << 20), "MALLOC_TRIM_THRESHOLD_": str(32 << 20)}}
    assert got["mix"] == {"rc": 0, "mapped": {"2": True, "8": True}, "env": {
        "MALLOC_MMAP_THRESHOLD_": str(1 << 20), "MALLOC_TRIM_THRESHOLD_": None}}


RSS_CHILD = r"""
import resource, subprocess, sys
subprocess.run([sys.executable, "-m", "workers.stages", "mix", "--spec", sys.argv[1]],
               check=True, capture_output=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


@pytest.mark.slow
def test_mix_peak_rss_is_flat_in_the_records(tmp_path):
    """The whole mix process, 10K vs 40K records per source (two sources of ~2 KB records):
    peak RSS within 1.25x (it grew 1.39x from 50K to 200K on the scale bench before)."""
    peaks = []
    for n in (10_000, 40_000):
        base = tmp_path / f"n{n}"
        srcs = [_dataset(base / f"src{k}", n, seed=10 * n + k) for k in range(2)]
        spec = base / "spec.json"
        spec.write_text(json.dumps(_mix_spec(base, srcs)))
        p = subprocess.run([sys.executable, "-c", RSS_CHILD, str(spec)], cwd=REPO,
                           capture_output=True, text=True, check=True)
        peaks.append(int(p.stdout.split()[-1]))
    assert peaks[1] < 1.25 * peaks[0], peaks
