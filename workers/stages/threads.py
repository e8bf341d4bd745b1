"""Torch threads per stage, from the cores the job gets.

Torch starts one OpenMP thread per core in every process, so two CPU stages on one box run
twice as many threads as cores; measured on a loaded 2-core box, generate ran 20.7 tokens/s
with 1 torch thread and 3.6 with 2. A CPU job gets the node's cores divided among its CPU
slots (DRAFTYARD_CPU_SLOTS, app/core/config.py); the worker passes that number to the stage
(STAGE_THREADS_ENV), which sets it before any forward. An explicit OMP_NUM_THREADS in the
worker's environment wins (the tests pin 1).
"""

from __future__ import annotations

import os
import sys

STAGE_THREADS_ENV = "DRAFTYARD_STAGE_THREADS"


def stage_threads(cores: int, cpu_slots: int, gpus: int) -> int | None:
    """Threads for one stage: a CPU job's share of the cores; None for a GPU job (its host
    threads feed the GPU, and the box's split between GPU and CPU jobs is not known here)."""
    if gpus > 0:
        return None
    return max(1, cores // max(1, cpu_slots))


def threads_env(env: dict[str, str], cpu_slots: int, gpus: int) -> dict[str, str]:
    """The stage's environment entries for its threads (none when OMP_NUM_THREADS is set)."""
    n = stage_threads(os.cpu_count() or 1, cpu_slots, gpus)
    if n is None or env.get("OMP_NUM_THREADS"):
        return {}
    return {STAGE_THREADS_ENV: str(n), "OMP_NUM_THREADS": str(n)}


def apply_stage_threads() -> int | None:
    """In the stage process: set torch's threads to what the worker passed. OMP_NUM_THREADS
    covers a fresh process (torch reads it when imported); a warm starter's child imported
    torch before its environment was set, so it is told directly."""
    raw = os.environ.get(STAGE_THREADS_ENV)
    if not raw or not raw.isdigit() or int(raw) < 1:
        return None
    n = int(raw)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)
    return n
