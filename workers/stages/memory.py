"""Allocators for the streaming stages, whose peak memory must not grow with their records.

pyarrow's default pool (mimalloc in pyarrow 26) keeps freed pages for reuse, and glibc's malloc
raises its mmap threshold after the first big free, so that later batch-sized buffers come from
the heap and fragment it. Measured on the scale bench's sets (issue 22): mix's peak RSS went
287 -> 335 MB from 50K to 200K records with the defaults, 187 -> 192 MB with the system pool
and a fixed 128 KiB mmap threshold (a batch's buffers are then mapped and given back whole).
ingest's went 159 -> 174 MB (openorca) where mimalloc held 233 -> 250 MB.

Both must be in place before pyarrow makes its default pool (the C++ readers use that one
whatever `pa.set_memory_pool` says), so `python -m workers.stages` applies them before it
imports the stage. Environment variables an operator set win.
"""

from __future__ import annotations

import ctypes
import os

STREAMING_STAGES = frozenset({"ingest", "mix", "split"})
MMAP_THRESHOLD = 128 << 10
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
