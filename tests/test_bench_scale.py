"""bench/scale.py at a tiny size, so that the seeds' scale bench cannot rot: the whole data
plane through a real API and worker (ingest of the six native shapes, mix with dedupe, plan,
prepare with the real Qwen3 tokenizer), its table and its JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # the bench end to end (~1 min of stage processes); make test-all
def test_scale_bench_runs_at_a_tiny_size():
    p = subprocess.run([sys.executable, "bench/scale.py", "--sizes", "240", "--quick"],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = p.stdout.strip().splitlines()
    results = {r["metric"]: r for r in json.loads(lines[-1])}
    assert {"events_per_job_beyond_1_per_s", "data_plane_peak_rss_mb_240"} <= set(results)
    assert set(results["data_plane_peak_rss_mb_240"]) >= {"bench", "value", "baseline", "ratio",
                                                          "target", "pass"}
    table = [x.split() for x in lines if x.split()[:2] in (["ingest", "240"], ["mix", "240"],
                                                          ["plan", "240"], ["prepare", "240"])]
    # Each stage once in the size's table and once in the summary; every stage measured.
    assert sorted(r[0] for r in table) == ["ingest"] * 2 + ["mix"] * 2 + ["plan"] * 2 + \
        ["prepare"] * 2
    ingest = next(r for r in table if r[0] == "ingest")
    assert int(ingest[6]) == 6  # six ingest jobs, one per source
    assert "rejected" in p.stdout and "deduplicated" in p.stdout
