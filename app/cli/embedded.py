"""Start and stop the embedded service as a child process (the demo drives it over HTTP)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from app.core.config import get_settings
from procgroup import spawn, stop_group
from draftyard import Client


def start_embedded(port: int) -> subprocess.Popen:
    s = get_settings()
    s.home.mkdir(parents=True, exist_ok=True, mode=0o700)  # private (app/core/private.py)
    # Dies with the demo that started it, even when the demo is SIGKILLed.
    proc = spawn([sys.executable, "-m", "app.cli.main", "up", "--port", str(port)],
                 log=s.home / "server.log", stdin=None, death_signal=signal.SIGTERM)
    deadline = time.time() + 90
    with Client(f"http://127.0.0.1:{port}", timeout=2) as c:
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the embedded service exited; see {s.home / 'server.log'}")
            if c.ready():
                return proc
            time.sleep(0.5)
    raise RuntimeError("the embedded service did not become ready in 90 s")


def stop(proc: subprocess.Popen) -> None:
    stop_group(proc, 20.0)
