"""The one process-lifecycle module: children that die with their parent, and stopping a
child with everything it started (SIGTERM to its process group, a grace period, SIGKILL).

Used by the CLI (`draftyard up` and its worker, the demo's embedded service), the worker's
supervisor (a stage child) and the stages (vLLM servers, torchrun). Standard library only, so
app/ and workers/stages/ may both import it (tests/test_layering.py).

Why groups: the servers and launchers the stages run (vLLM, torchrun) start their own
children, and what holds GPU memory is often a grandchild, so a stop waits for the whole
group, not only its leader. Why PR_SET_PDEATHSIG (`die_with_parent`, for children of a
process's main thread: the CLI's services, a stage's vLLM server): a parent killed by SIGKILL
runs no cleanup; the kernel's signal is the only thing that still reaches its child. A stage
started from a worker's pool thread uses `watch_parent` instead (the signal is tied to the
forking thread, which outlives a failed supervisor, issue #17).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A `preexec_fn`: the child gets `sig` when the process that started it dies, even by
    SIGKILL (Linux; elsewhere a no-op, and the parent's own cleanup has to do)."""
    parent = os.getpid()

    def preexec() -> None:  # runs in the child between fork and exec
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), sig)
    return preexec


def signal_group(pgid: int, sig: int) -> None:
    """Signal a process group that may be gone already."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
# The pid of the process that supervises a stage (set by workers/supervisor.py).
PARENT_ENV = "DRAFTYARD_SUPERVISOR_PID"


def watch_parent(poll_s: float = 0.5) -> None:
    """Kill this process's whole group (the stage and what it started) as soon as the
    supervising worker process is gone. PR_SET_PDEATHSIG cannot do this: it fires when the
    *thread* that forked us exits (Celery pool threads outlive a failed supervisor and a
    worker process outlives them) and it reaches only the direct child, not a vLLM server or
    torchrun workers in the group. No-op when run alone from a shell."""
    want = os.environ.get(PARENT_ENV)
    if not want or not want.isdigit():
        return

    def _watch() -> None:
        # getppid() changes when the parent dies (we are re-parented), also if it died
        # before this thread started: compare with the pid recorded at spawn.
        while os.getppid() == int(want):
            time.sleep(poll_s)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=_watch, name="watch-parent", daemon=True).start()


def group_members(pgid: int) -> list[int] | None:
    """Live (non-zombie) processes of a process group, from /proc; None without /proc."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    members = []
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        # fields[0] is the state (field 3), fields[2] the process group (field 5).
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(d.name))
    return members


def groups_where(pred: Callable[[dict[str, str]], bool]) -> set[int]:
    """Process groups (other than ours) of the live processes whose environment satisfies
    `pred` (e.g. what a dead worker's stages inherited), from /proc; empty without /proc."""
    found: set[int] = set()
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    me = os.getpgrp()
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "environ").read_bytes().decode(errors="replace")
            env = dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)
            if pred(env) and (pgid := os.getpgid(int(d.name))) != me:
                found.add(pgid)
        except OSError:
            continue  # exited while we looked, or not ours to read
    return found


def group_alive(pgid: int) -> bool:
    members = group_members(pgid)
    if members is not None:
        # A zombie leader (exited, not yet reaped) counts as gone: it holds no GPU memory.
        return bool(members)
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def kill_group(pgid: int, grace_s: float, leader: subprocess.Popen | None = None,
               kill_wait_s: float = 5.0) -> None:
    """SIGTERM the whole group, then SIGKILL what is left after grace_s, and wait (up to
    kill_wait_s) until it is gone: SIGKILL is delivered asynchronously, and a caller that
    goes on to requeue the job must not find the old attempt still running."""
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if leader is not None:
            leader.poll()  # reap our own child so it does not linger as a zombie
        if not group_alive(pgid):
            return
        time.sleep(0.1)
    signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + kill_wait_s
    while time.monotonic() < deadline:
        if leader is not None:
            leader.poll()
        if not group_alive(pgid):
            return
        time.sleep(0.02)


def stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM `proc`'s process group, SIGKILL what is left after `grace_s`, reap `proc`."""
    kill_group(proc.pid, grace_s, leader=proc)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
