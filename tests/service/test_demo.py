"""The demo end to end (its quick variant): what `make demo` runs, on the embedded service."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO, free_port


def test_demo_quick_runs_the_whole_pipeline(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("DRAFTYARD_DATABASE_URL", "DRAFTYARD_BROKER_URL", "DRAFTYARD_DATA_ROOTS",
                        "DRAFTYARD_MODEL_ROOTS")}
    env.update(DRAFTYARD_HOME=str(tmp_path / "home"), DRAFTYARD_DEMO_PORT=str(free_port()),
               OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "app.cli.main", "demo", "--quick", "--json"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    last = p.stdout.strip().splitlines()[-1]
    out = json.loads(last)
    assert p.returncode == 0 and out["status"] == "succeeded", p.stdout[-3000:] + p.stderr[-3000:]
    assert set(out["artifacts"]) == {"generate", "prepare", "extract", "train", "evaluate"}
    assert out["tau"] >= 1.0 and out["tau_baseline"] >= 1.0  # accepted prefix + bonus token
    assert "acceptance" in p.stdout and "vllm serve" in p.stdout
