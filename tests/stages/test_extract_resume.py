"""extract stage: SIGKILL of the stage process mid-way, then a retry with the same spec,
gives every sample exactly once and the same values as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.stages.conftest import REPO
from tests.stages.test_extract_hf import load_hs, make_spec, make_tokenized, run_stage

torch = pytest.importorskip("torch")

N = 160


def _start(spec_path: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "workers.stages", "extract", "--spec",
                             str(spec_path)], cwd=REPO, env=env, stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT)


def test_sigkill_then_retry_completes_once_and_equal(tmp_path, tiny_target, datasets_dir):
    tokd = tmp_path / "tokenized"
    rows = make_tokenized(tokd, tiny_target, datasets_dir, n=N)
    job = tmp_path / "job"
    spec = make_spec(job, tokd, tiny_target, batch_tokens=256)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    scratch = job / "work" / "hidden_states"

    proc = _start(spec_path, tmp_path / "stage.log")
    deadline = time.monotonic() + 240
    seen = 0
    while time.monotonic() < deadline and proc.poll() is None:
        if scratch.is_dir():
            seen = sum(1 for n in os.listdir(scratch) if n.startswith("hs_"))
            if seen >= 30:
                break
        time.sleep(0.01)
    assert proc.poll() is None, ("the stage finished (or died) before it could be killed: "
                                 + (tmp_path / "stage.log").read_text()[-2000:])
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    partial = sorted(n for n in os.listdir(scratch) if n.startswith("hs_"))
    assert 30 <= len(partial) < N, "killed mid-way"
    assert not (job / "out" / "hidden_states").exists()

    proc = _start(spec_path, tmp_path / "stage.log")
    assert proc.wait(timeout=300) == 0, (tmp_path / "stage.log").read_text()[-3000:]
    events = [json.loads(x) for x in (job / "events.jsonl").read_text().splitlines()]
    result = [e["data"] for e in events if e["kind"] == "result"]
    assert len(result) == 1
    assert result[0]["resumed_samples"] >= len(partial)
    assert result[0]["resumed_samples"] + result[0]["extracted_samples"] == N

    out = job / "out" / "hidden_states"
    names = sorted(os.listdir(out))
    assert names == sorted([f"hs_{i}.safetensors" for i in range(N)] + ["meta.json"])
    assert not scratch.exists()

    # The same spec, uninterrupted, in a fresh job folder.
    clean_spec = make_spec(tmp_path / "clean", tokd, tiny_target, batch_tokens=256)
    run_stage(clean_spec)
    clean = tmp_path / "clean" / "out" / "hidden_states"
    for i in range(N):
        a, b = load_hs(out, i), load_hs(clean, i)
        assert a["token_ids"].tolist() == b["token_ids"].tolist() == rows[i]
        # Batches after the retry are cut differently, so padding differs: equal up to
        # float32 summation order.
        torch.testing.assert_close(a["hidden_states"], b["hidden_states"], atol=1e-5, rtol=1e-5)
    meta = json.loads((out / "meta.json").read_text())
    clean_meta = json.loads((clean / "meta.json").read_text())
    assert meta["bytes"] == clean_meta["bytes"] and meta["num_samples"] == N
