"""Extraction backends behind one interface.

    extract(job: ExtractJob, todo: list[(row id, length)], progress) -> stats dict

A backend writes `hs_{idx}.safetensors` for every row in `todo` into `job.folder` (through
`writer.write_sample`, so every file appears atomically) and calls `progress(samples,
tokens)` with running totals. `hf` runs transformers in this process (or one process per
GPU); `vllm` starts a vLLM server with speculators' hidden-states connector on the leased
GPUs and drives it over HTTP.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.extract import ExtractVllmParams
from contracts.resolved import ResolvedTarget
from workers.stages.extract.layers import LayerPlan

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class ExtractJob:
    tokenized_path: str
    target: ResolvedTarget        # the resolved target input (contracts/resolved.py)
    layers: LayerPlan
    dtype: str                    # storage dtype (and the hf backend's compute dtype)
    batch_tokens: int
    batch_mode: str               # padded | packed (resolved, never auto)
    attn_implementation: str | None
    folder: Path                  # where hs_{idx}.safetensors go (scratch under work_dir)
    work_dir: Path
    workers: int                  # hf: data-parallel processes
    vllm: ExtractVllmParams


def open_rows(tokenized_path: str) -> Any:
    """The tokenized data set, read as numpy (memory-mapped Arrow, cheap to open per
    process; speculators' prepare saves it in torch format, which we do not need here)."""
    from datasets import load_from_disk

    return load_from_disk(tokenized_path).with_format("numpy")


def read_input_ids(ds: Any, indices: list[int] | tuple[int, ...]) -> list[Any]:
    """input_ids of the given rows, as int64 numpy arrays, in the given order."""
    import numpy as np

    col = ds[list(indices)]["input_ids"]
    return [np.asarray(r, dtype=np.int64) for r in col]


def get_backend(name: str) -> Callable[[ExtractJob, list[tuple[int, int]], Progress], dict]:
    if name == "hf":
        from workers.stages.extract.backends.hf import extract
    elif name == "vllm":
        from workers.stages.extract.backends.vllm import extract
    else:
        raise ValueError(f"unknown backend {name!r}")
    return extract
