"""Torch threads per stage from the cores a job gets (workers/stages/threads.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from workers.stages.threads import STAGE_THREADS_ENV, stage_threads, threads_env

REPO = Path(__file__).resolve().parents[2]


def test_a_cpu_job_gets_its_share_of_the_cores():
    assert stage_threads(cores=8, cpu_slots=2, gpus=0) == 4
    assert stage_threads(cores=2, cpu_slots=2, gpus=0) == 1   # the 2-core box: no oversubscription
    assert stage_threads(cores=2, cpu_slots=4, gpus=0) == 1   # never 0
    assert stage_threads(cores=8, cpu_slots=0, gpus=0) == 8
    assert stage_threads(cores=8, cpu_slots=2, gpus=1) is None


def test_an_explicit_omp_setting_wins():
    assert threads_env({"OMP_NUM_THREADS": "3"}, cpu_slots=2, gpus=0) == {}
    env = threads_env({}, cpu_slots=1, gpus=0)
    n = str(os.cpu_count() or 1)
    assert env == {STAGE_THREADS_ENV: n, "OMP_NUM_THREADS": n}
    assert threads_env({}, cpu_slots=1, gpus=2) == {}


def test_the_stage_process_sets_torch_threads_even_after_torch_was_imported():
    """A warm starter's child has torch loaded before its environment arrives: the stage
    entry point sets the threads itself (run in a real child process)."""
    code = ("import torch; torch.set_num_threads(2); "
            "from workers.stages.threads import apply_stage_threads; "
            "print(apply_stage_threads(), torch.get_num_threads())")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={**env, STAGE_THREADS_ENV: "1", "PYTHONPATH": str(REPO)},
                         check=True).stdout.split()
    assert out == ["1", "1"]
