"""Allocators for the streaming stages, whose peak memory must not grow with their records.

pyarrow's default pool (mimalloc in pyarrow 26) keeps freed pages for reuse, and glibc's malloc
raises its mmap threshold after the first big free, so that later batch-sized buffers come from
the heap and fragment it. Measured on the scale bench's sets (issue 22), peak RSS of the stage
process at 50K -> 800K records (after the Parquet reads stopped pre-buffering, records.py):
mix 287 -> 335 MB at 50K -> 200K with the defaults; with the system pool and a fixed mmap
threshold (a batch's buffers are then mapped and given back whole) 259 -> 291 MB at 50K ->
800K, ingest's largest source (openorca) 190 -> 209 MB. The threshold costs CPU in page
faults: at 128 KiB mix took 20% more CPU than before these changes, at 1 MiB 9% (the same
flatness), at 4 MiB no more but 317 MB at 200K already.

Both must be in place before pyarrow makes its default pool (the C++ readers use that one
whatever `pa.set_memory_pool` says), so `python -m workers.stages` applies them before it
imports the stage. Environment variables an operator set win.
"""

from __future__ import annotations

import ctypes
import os

STREAMING_STAGES = frozenset({"ingest", "mix", "split"})
MMAP_THRESHOLD = 1 << 20
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def lean_allocators() -> bool:
    """System pool for Arrow, a fixed mmap threshold for malloc (this process and the
    processes it starts). True when malloc took the threshold (glibc)."""
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    threshold = int(os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(MMAP_THRESHOLD)))
    try:
        return bool(ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return False
