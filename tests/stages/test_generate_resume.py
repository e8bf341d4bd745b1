"""Kill the generate stage with SIGKILL mid-way, run it again on the same spec and work_dir:
every input record appears exactly once in the output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.stages.conftest import REPO, target_input
from tests.stages.generate_support import events, make_spec

N = 10


def _start(spec_path: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "workers.stages", "generate", "--spec",
                             str(spec_path)], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


# slow (~20 CPU-s): `make test` covers a SIGKILL mid-generate and a retry that writes every
# record once through the service (tests/service/test_generate_kill.py).
@pytest.mark.slow
def test_sigkill_mid_way_then_rerun_gives_every_record_once(tiny_target, tmp_path):
    records = [{"id": f"r{i:02d}", "source": f"t:{i}", "messages": [
        {"role": "user", "content": f"Question {i}: " + "tell me more " * (i % 4)}]}
        for i in range(N)]
    records[3]["messages"] = [{"role": "system", "content": "no question here"}]  # a failure
    spec = make_spec(tmp_path, records, target_input(tiny_target), max_tokens=24,
                     batch_size=2, shard_records=2, max_failure_share=0.2)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    shards = Path(spec["work_dir"]) / "generate" / "shards"

    proc = _start(spec_path)
    deadline = time.monotonic() + 300
    while not list(shards.glob("shard-*.parquet")):
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not any(e["kind"] == "result" for e in events(spec))  # it really died mid-way
    first = {p.name: p.read_bytes() for p in shards.glob("shard-*.parquet")}
    done_at_kill = sum(pq.read_metadata(shards / n).num_rows for n in first)
    assert 0 < done_at_kill < N

    proc = _start(spec_path)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-3000:]
    result = [e["data"] for e in events(spec) if e["kind"] == "result"][-1]
    assert result["resumed_records"] == done_at_kill  # earlier shards were not redone
    for name, data in first.items():
        assert (shards / name).read_bytes() == data
    # ... and nothing was generated twice: the shards hold each record once.
    assert sum(pq.read_metadata(p).num_rows for p in shards.glob("shard-*.parquet")) == N

    folder = Path(spec["out_dir"]) / "dataset"
    out_ids = pq.read_table(folder / "data.parquet", columns=["id"]).column("id").to_pylist()
    failed = [json.loads(x)["id"] for x in (folder / "failures.jsonl").read_text().splitlines()]
    assert failed == ["r03"]
    assert len(out_ids) == len(set(out_ids)) == N - 1
    assert sorted(out_ids + failed) == [r["id"] for r in records]
    tok_ids = pq.read_table(folder / "token_ids.parquet", columns=["id"]).column("id").to_pylist()
    assert sorted(tok_ids) == sorted(out_ids)  # one generated turn per prompt-only record
    # Windows are taken in input order, so the output keeps it across the restart.
    assert out_ids == [r["id"] for r in records if r["id"] != "r03"]
    meta = json.loads((folder / "meta.json").read_text())
    assert (meta["num_records"], meta["num_failed"]) == (N - 1, 1)
    assert meta["stats"]["resumed_records"] == done_at_kill
