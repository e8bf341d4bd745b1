"""procgroup: the process lifecycle shared by the CLI, the supervisor and the stages, on real
processes: a child dies with a parent killed by SIGKILL, and a stop takes the whole group
(grandchildren that ignore SIGTERM included) after the grace period."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from procgroup import group_alive, stop_group
from tests.conftest import REPO, wait_for


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_stop_group_kills_a_group_that_ignores_sigterm_after_the_grace():
    # bash ignores TERM, and so does its child (SIG_IGN survives exec)
    proc = subprocess.Popen(["bash", "-c", 'trap "" TERM; sleep 60 & echo $!; wait'],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    grandchild = int(proc.stdout.readline())
    t0 = time.monotonic()
    stop_group(proc, 0.5)
    assert time.monotonic() - t0 >= 0.5  # it was given the grace, and ignored it
    assert proc.returncode == -signal.SIGKILL
    assert not group_alive(proc.pid)
    wait_for(lambda: _gone(grandchild), 5, 0.05, "the grandchild to die")


def test_a_child_dies_with_its_parent_even_by_sigkill():
    code = ("import subprocess, signal, sys, time; from procgroup import die_with_parent; "
            "p = subprocess.Popen(['sleep', '60'], preexec_fn=die_with_parent(signal.SIGKILL)); "
            "print(p.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    child = int(parent.stdout.readline())
    assert not _gone(child)
    parent.kill()
    parent.wait()
    wait_for(lambda: _gone(child), 5, 0.05, "the child to die with its parent")
