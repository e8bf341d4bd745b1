"""A worker machine whose clock is off, for the tests: `skewed_env(seconds, how)`.

how="libc": the process tree's real-time clock itself reads off (fakeclock.c, preloaded;
built here with the system C compiler), as on a machine with a wrong clock: what every
version of draftyard sees. how="env": DRAFTYARD_CLOCK_OFFSET_S, which app/core/clock.py's
local clock adds (no compiler needed)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

SRC = Path(__file__).with_name("fakeclock.c")


@lru_cache
def fakeclock_lib() -> Path | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    out = Path(tempfile.mkdtemp(prefix="draftyard-fakeclock-")) / "fakeclock.so"
    r = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(SRC), "-ldl"],
                       capture_output=True, text=True)
    return out if r.returncode == 0 else None


def skewed_env(seconds: float, how: str) -> dict[str, str]:
    if how == "env":
        return {"DRAFTYARD_CLOCK_OFFSET_S": str(seconds)}
    lib = fakeclock_lib()
    if lib is None:
        pytest.skip("no C compiler to build the clock shim (tests/machines/fakeclock.c)")
    return {"LD_PRELOAD": str(lib), "FAKECLOCK_OFFSET_S": str(int(seconds))}
