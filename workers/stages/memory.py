"""Allocators for the streaming stages, whose peak memory must not grow with their records.

pyarrow's default pool (mimalloc in pyarrow 26) keeps freed pages for reuse, and glibc's malloc
raises its mmap threshold after the first big free, so that later batch-sized buffers come from
the heap and fragment it. Measured on the scale bench's sets, peak RSS of the stage
process at 50K -> 800K records (after the Parquet reads stopped pre-buffering, records.py):
mix 287 -> 335 MB at 50K -> 200K with the defaults; with the system pool and a fixed mmap
threshold (a batch's buffers are then mapped and given back whole) 259 -> 291 MB at 50K ->
800K, ingest's largest source (openorca) 190 -> 209 MB. The threshold costs CPU in page
faults: at 128 KiB mix took 20% more CPU than before these changes, at 1 MiB 9% (the same
flatness), at 4 MiB no more but 317 MB at 200K already.

Ingest is different: it reads a source in blocks of 1,024 records and hands 4,096-record row
groups to a writer thread, so most of its buffers are 1-4 MiB. At a 1 MiB threshold every one
of them was a fresh mapping, faulted in page by page and given back: 527K page faults for the
scale bench's 200K OpenOrca file, a quarter of the stage's CPU. Its own setting, measured on
the OpenOrca and Evol-CodeAlpaca files at 50K and 800K records (in-process peak RSS, wall of
the 800K OpenOrca file): 1 MiB 228 -> 240 MB, 6.6 s; glibc's defaults 325 -> 354 MB, 4.4 s;
4 MiB 256 -> 269 MB, 4.9 s; 4 MiB with a 32 MiB trim threshold (the heap's top is kept
rather than given back and faulted in again) 265 -> 288 MB, 4.5 s, 50K page faults at 200K.

Both must be in place before pyarrow makes its default pool (the C++ readers use that one
whatever `pa.set_memory_pool` says), so `python -m workers.stages` applies them before it
imports the stage (a warm starter's child applies its stage's again: mallopt works at any
time). Environment variables an operator set win.
"""

from __future__ import annotations

import ctypes
import os

MMAP_THRESHOLD = 1 << 20
# (mmap threshold, trim threshold or None for glibc's) of a stage other than the default
STAGE_MALLOC = {"ingest": (4 << 20, 32 << 20)}
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def malloc_settings(stage: str | None) -> tuple[int, int | None]:
    """(mmap threshold, trim threshold) for a stage's process (None: glibc's own)."""
    return STAGE_MALLOC.get(stage or "", (MMAP_THRESHOLD, None))


def lean_allocators(stage: str | None = None, export: bool = True) -> bool:
    """System pool for Arrow, a fixed mmap threshold (and for some stages a trim threshold)
    for malloc: in this process and, through the environment, the processes it starts
    (`export=False`: malloc's only in this process, as a warm starter does, whose children
    set their own stage's). True when malloc took them (glibc)."""
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    mmap, trim = malloc_settings(stage)
    env = os.environ if export else dict(os.environ)
    mmap = int(env.setdefault("MALLOC_MMAP_THRESHOLD_", str(mmap)))
    if trim is not None:
        trim = int(env.setdefault("MALLOC_TRIM_THRESHOLD_", str(trim)))
    try:
        mallopt = ctypes.CDLL(None).mallopt
        ok = bool(mallopt(_M_MMAP_THRESHOLD, mmap))
        if trim is not None:
            ok = bool(mallopt(_M_TRIM_THRESHOLD, trim)) and ok
        return ok
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return False
