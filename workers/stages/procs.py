"""Stopping a child and everything it started: the servers and launchers the stages run
(vLLM, torchrun) live in their own process group, and what holds GPU memory is often a
grandchild, so a stop waits for the whole group, not only its leader."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path


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


def kill_group(pgid: int, grace_s: float, leader: subprocess.Popen | None = None) -> None:
    """SIGTERM the whole group, then SIGKILL what is left after grace_s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if leader is not None:
            leader.poll()  # reap our own child so it does not linger as a zombie
        if not group_alive(pgid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM `proc`'s process group, SIGKILL what is left after `grace_s`, reap `proc`."""
    kill_group(proc.pid, grace_s, leader=proc)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
