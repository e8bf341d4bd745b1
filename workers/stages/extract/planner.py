"""The storage planner: how many bytes offline hidden states take, and whether they fit.

Offline hidden states cost hidden_size x layers x dtype-size bytes per token (about 40 KiB
per token for Qwen3-8B with 5 layers), so a run over a real data set is easily tens of TB.
The extract stage calls `check_disk` before it writes anything; the plan stage (`POST
/v1/plans`) calls `estimate_hidden_state_bytes` + `disk_check` for the same numbers without
raising.

Pure: no torch, no I/O except `shutil.disk_usage`.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from contracts.extract import DEFAULT_MARGIN_BYTES  # re-exported
from workers.stages.common import StageError

from contracts.storage import (DTYPE_SIZES, FILE_OVERHEAD_BYTES,  # noqa: F401 (re-exported)
                               TOKEN_ID_BYTES, hidden_state_bytes, human_bytes)


def dtype_size(dtype: str) -> int:
    try:
        return DTYPE_SIZES[dtype]
    except KeyError:
        raise StageError("invalid_params", f"dtype must be one of {sorted(DTYPE_SIZES)}, "
                         f"got {dtype!r}", details={"field": "dtype"}) from None


def estimate_hidden_state_bytes(num_tokens: int, num_layers: int, hidden_size: int,
                                dtype: str, num_samples: int = 0) -> int:
    """Bytes on disk for `num_tokens` tokens (contracts/storage.py, which the scheduler's
    disk reservation uses too). With num_samples=0 this is the payload only."""
    return hidden_state_bytes(num_tokens, num_layers, hidden_size, dtype_size(dtype),
                              num_samples)


def _existing_ancestor(path: Path) -> Path:
    """disk_usage needs an existing path; the artifact folder may not exist yet."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


@dataclass(frozen=True)
class DiskCheck:
    ok: bool
    bytes_needed: int
    free_bytes: int
    margin_bytes: int
    path: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def disk_check(bytes_needed: int, path: str | os.PathLike, margin: int = DEFAULT_MARGIN_BYTES,
               free_bytes_override: int | None = None) -> DiskCheck:
    """Compare bytes_needed with the free space of path's filesystem minus margin."""
    where = _existing_ancestor(Path(path))
    free = int(free_bytes_override) if free_bytes_override is not None \
        else shutil.disk_usage(where).free
    ok = bytes_needed <= free - margin
    numbers = (f"hidden states need {human_bytes(bytes_needed)} ({bytes_needed} bytes), "
               f"{human_bytes(free)} ({free} bytes) free at {path} "
               f"(margin {human_bytes(margin)})")
    if ok:
        msg = numbers
    else:
        msg = (f"{numbers}; options: fewer samples (max_samples), online mode (train pulls "
               f"hidden states itself, no extract), another volume (DRAFTYARD_HOME)")
    return DiskCheck(ok=ok, bytes_needed=int(bytes_needed), free_bytes=free,
                     margin_bytes=int(margin), path=str(path), message=msg)


def check_disk(bytes_needed: int, path: str | os.PathLike, margin: int = DEFAULT_MARGIN_BYTES,
               free_bytes_override: int | None = None) -> DiskCheck:
    """`disk_check`, raising StageError("insufficient_disk") when it does not fit."""
    c = disk_check(bytes_needed, path, margin, free_bytes_override)
    if not c.ok:
        raise StageError("insufficient_disk", c.message,
                         details={"bytes_needed": c.bytes_needed, "free_bytes": c.free_bytes,
                                  "margin_bytes": c.margin_bytes, "path": c.path,
                                  "options": ["fewer samples", "online mode", "another volume"]})
    return c
