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


def test_kill_tagged_finds_the_attempt_in_other_sessions_and_after_re_parenting():
    """What a process group cannot find: a descendant in a session of its own (as torchrun
    starts its ranks) whose parent has exited (re-parented to init or a subreaper)."""
    from procgroup import TAG_ENV, job_tag, kill_tagged, tagged

    tag = job_tag("procgroup-test", "j1") + "1"
    env = {**os.environ, TAG_ENV: tag}
    p = subprocess.Popen(["bash", "-c", "setsid sleep 60 & echo $!"], stdout=subprocess.PIPE,
                         text=True, env=env)
    orphan = int(p.stdout.readline())
    p.wait()
    wait_for(lambda: not _gone(orphan) and os.getsid(orphan) == orphan, 5, 0.05, "setsid")
    assert tagged(tag) == [orphan]
    assert tagged(job_tag("procgroup-test", "j1")) == [orphan]  # every attempt of the job
    assert tagged(job_tag("procgroup-test", "j2")) == [] and tagged(tag + "0") == []
    assert kill_tagged(tag) == [orphan]
    assert _gone(orphan) and tagged(tag) == []


def test_bind_to_parent_dies_with_the_parent_and_refuses_a_stranger():
    """torchrun's ranks arm their own death signal: killed with their parent even by
    SIGKILL; and a rank whose parent is already gone (re-parented to a process without the
    attempt's tag) dies at once instead of training as an orphan."""
    from procgroup import TAG_ENV

    env = {**os.environ, TAG_ENV: "t/j/1", "PYTHONPATH": str(REPO)}
    child = ("import time; from procgroup import bind_to_parent; bind_to_parent(); "
             "print('armed', flush=True); time.sleep(60)")
    parent_code = ("import subprocess, sys, time; "
                   f"p = subprocess.Popen([sys.executable, '-c', {child!r}]); "
                   "print(p.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE,
                              text=True, cwd=REPO, env=env)
    rank = int(parent.stdout.readline())
    time.sleep(1.0)
    assert not _gone(rank)
    parent.kill()
    parent.wait()
    wait_for(lambda: _gone(rank), 5, 0.05, "the rank to die with its parent")
    # This test process does not carry the tag: a child claiming it dies when it binds.
    stranger = subprocess.Popen([sys.executable, "-c", child], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, text=True)
    assert stranger.wait(10) == -signal.SIGKILL and stranger.stdout.read() == ""


def test_peak_memory_counts_every_process_of_the_attempt_and_the_node():
    """procgroup.memory: the high-water RSS of an attempt's processes, found by their tag in
    sessions of their own, sampled while they run; it outlives them (the figure a job's error
    carries after the OOM killer's SIGKILL)."""
    from procgroup import TAG_ENV
    from procgroup.memory import PeakMemory, node_memory

    tag = f"test-peak/{os.getpid()}/1"
    hold = ("import sys, time; b = bytearray(int(sys.argv[1]) << 20); "
            "b[::4096] = b'x' * len(b[::4096]); print('ok', flush=True); time.sleep(60)")
    procs = [subprocess.Popen([sys.executable, "-c", hold, str(mb)], stdout=subprocess.PIPE,
                              env={**os.environ, TAG_ENV: tag}, start_new_session=True)
             for mb in (120, 60)]
    try:
        for p in procs:
            assert p.stdout.readline().startswith(b"ok")
        peak = PeakMemory(tag)
        peak.sample(procs[0].pid)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    peak.sample(procs[0].pid)  # both gone: the peak stays
    assert peak.processes == 2
    assert 180 << 20 < peak.peak_bytes < 400 << 20, peak.peak_bytes
    r = peak.report()
    assert r["peak_bytes"] == peak.peak_bytes
    assert 0 < r["node_available_bytes"] <= r["node_total_bytes"], r
    assert node_memory()["total_bytes"] == r["node_total_bytes"]
