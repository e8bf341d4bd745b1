"""The client of a warm starter (workers/stages/starter.py): a server process that has
imported what its children need once and forks one child per request. The API keeps one for
plans (app/plans/service.py), each worker process one for its model stages
(workers/supervisor.py).

`WarmStarter.start(request)` starts the server on first use (and again when it has died),
sends the request and returns a `WarmChild`: the forked child's pid (its process group's id)
and, like a `subprocess.Popen`, `poll()` and `wait()` for its exit status, which the server
sends when it has reaped the child. It returns None when the server cannot be reached or
declines the request; the caller then starts a fresh process, so a broken server costs time,
never a stage or a plan. A server that failed to start is not started again for
`retry_after_s` (a start that hangs must not cost every request its wait).

Protocol (JSON lines over a Unix socket, one request per connection):
  -> {"stage", "spec", "cwd", "timeout_s"?, "log"?, "env"?, "tag"?}
  <- {"pid": N}                      the child was forked
  <- {"rc": status, "timed_out": b}  it exited (negative status: killed by that signal)
  <- {"error": "..."}                instead of both: declined, nothing was started

Standard library only (app/ uses it too).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from procgroup import spawn

log = logging.getLogger("draftyard.warm")


class WarmChild:
    """A child forked by a warm starter, for its supervisor: `pid` (also its process group),
    `poll()`/`wait()` like Popen's. If the server dies first, the child died with it (its
    death signal): the status is then -SIGKILL."""

    def __init__(self, conn: socket.socket, pid: int, rest: bytes = b""):
        self.pid = pid
        self.returncode: int | None = None
        self.timed_out = False
        self._conn = conn
        self._buf = rest
        self._read(0.0)

    def _read(self, timeout: float | None) -> None:
        """Take what the server sent within `timeout` (None: until it answers)."""
        while self.returncode is None:
            if b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                with contextlib.suppress(ValueError):
                    msg = json.loads(line)
                    if isinstance(msg, dict) and "rc" in msg:
                        self._done(int(msg["rc"]), bool(msg.get("timed_out")))
                continue
            ready, _, _ = select.select([self._conn], [], [], timeout)
            if not ready:
                return
            try:
                chunk = self._conn.recv(4096)
            except OSError:
                chunk = b""
            if not chunk:  # the server is gone, and the child with it
                self._done(-signal.SIGKILL, False)
                return
            self._buf += chunk

    def _done(self, rc: int, timed_out: bool) -> None:
        self.returncode, self.timed_out = rc, timed_out
        with contextlib.suppress(OSError):
            self._conn.close()

    def poll(self) -> int | None:
        self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"warm child {self.pid}", timeout or 0)
            self._read(left)
        return self.returncode


class WarmStarter:
    """One warm server of this process, started on first use: `cmd` gets `--socket PATH`
    appended; `env()` is its environment, `log()` the file its output is appended to."""

    START_TIMEOUT_S = 60.0
    RETRY_AFTER_S = 300.0  # after a start that failed: fresh processes meanwhile
    ANSWER_TIMEOUT_S = 30.0  # for the server's {"pid"} line

    def __init__(self, name: str, cmd: Sequence[str], env: Callable[[], dict[str, str]],
                 log_path: Callable[[], Path], cwd: str | Path | None = None):
        self.name = name
        self.cmd = list(cmd)
        self.env = env
        self.log_path = log_path
        self.cwd = cwd
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._dir: Path | None = None
        self._failed_at: float | None = None

    @property
    def server_pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def socket_path(self) -> Path | None:
        return None if self._dir is None else self._dir / f"{self.name}.sock"

    def _ensure(self) -> Path | None:
        with self._lock:
            path = self.socket_path
            if self._proc is not None and self._proc.poll() is None and path and path.exists():
                return path
            self._stop()
            if self._failed_at is not None and \
                    time.monotonic() - self._failed_at < self.RETRY_AFTER_S:
                return None
            # A short private folder: a Unix socket's path has to fit in 108 bytes.
            self._dir = Path(tempfile.mkdtemp(prefix=f"draftyard-{self.name}-",
                                              dir="/tmp" if os.path.isdir("/tmp") else None))
            path = self.socket_path
            assert path is not None
            logf = self.log_path()
            logf.parent.mkdir(parents=True, exist_ok=True)
            self._proc = spawn([*self.cmd, "--socket", str(path)], env=self.env(),
                               cwd=self.cwd, log=logf,
                               death_signal=None)  # it watches this process instead
            deadline = time.monotonic() + self.START_TIMEOUT_S
            while time.monotonic() < deadline and self._proc.poll() is None:
                if path.exists():
                    self._failed_at = None
                    return path
                time.sleep(0.05)
            self._failed_at = time.monotonic()
            log.warning("the %s server did not start (status %s); starting fresh processes",
                        self.name, self._proc.poll())
            self._stop()
            return None

    def warm_up(self) -> None:
        """Start the server now, on a thread of its own, so that the first request finds it
        ready (a request meanwhile waits for it, as it would have)."""
        threading.Thread(target=self._ensure, name=f"{self.name}-warm-up", daemon=True).start()

    def _stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(5)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._proc = self._dir = None

    def stop(self) -> None:
        with self._lock:
            self._stop()

    def _died(self) -> bool:
        """Has the server exited? A killed process can take a moment to become reapable
        (its threads exit one by one), so wait briefly for it."""
        with self._lock:
            if self._proc is None:
                return True
            try:
                self._proc.wait(timeout=2)
                return True
            except subprocess.TimeoutExpired:
                return False

    def start(self, request: dict) -> WarmChild | None:
        """Fork `request` in the server; None: start it some other way."""
        for _ in range(2):  # a server that died just before this request: once more
            path = self._ensure()
            if path is None:
                return None
            child, declined = self._ask(path, request)
            if child is not None:
                return child
            if declined or not self._died():
                break
        log.warning("the %s server started nothing; starting a fresh process", self.name)
        return None

    def _ask(self, path: Path, request: dict) -> tuple[WarmChild | None, bool]:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.settimeout(self.ANSWER_TIMEOUT_S)
            conn.connect(str(path))
            conn.sendall(json.dumps(request).encode() + b"\n")
            buf = b""
            while b"\n" not in buf:
                chunk = conn.recv(4096)
                if not chunk:
                    raise OSError("the server closed the connection")
                buf += chunk
            line, rest = buf.split(b"\n", 1)
            msg = json.loads(line)
            if not isinstance(msg, dict) or not isinstance(msg.get("pid"), int):
                log.warning("the %s server declined: %s", self.name, msg)
                conn.close()
                return None, True
            conn.settimeout(None)
            return WarmChild(conn, msg["pid"], rest), False
        except (OSError, ValueError):
            conn.close()
            return None, False
