"""Things built once per machine and kept in the cache ($DRAFTYARD_CACHE, tokenizer_load.
cache_root): the demo target, the real target. One builder at a time per folder."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path


def build_once(final: Path, done_file: str, build: Callable[[Path], object]) -> Path:
    """`final`, built by `build(tmp)` unless `final/done_file` exists already.

    `build` fills the temporary folder it is given and writes `done_file` last; the folder is
    then renamed into place, so a reader never sees half a build. Parallel builders of the
    same folder (test processes, two CLIs) wait on a lock and reuse the first one's result
    instead of spending the same minutes again.
    """
    if (final / done_file).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.with_name(f"{final.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / done_file).is_file():
            return final
        tmp = final.with_name(f"{final.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        build(tmp)
        shutil.rmtree(final, ignore_errors=True)  # a folder without its done file: half-built
        tmp.rename(final)
    return final
