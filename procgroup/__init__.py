"""The one process-lifecycle module: every process draftyard starts (workers/ and app/ call
`spawn`, nothing else), children that die with their parent, stopping a child with everything
it started, and the rule that nothing a job starts outlives it (docs/STYLE.md rule 17).

Standard library only, so app/ and workers/stages/ may both import it (tests/test_layering.py).

The rule, and why this one:
- **A tag in the environment of every descendant.** The supervisor starts each stage attempt
  with `DRAFTYARD_ATTEMPT=<deployment>/<job>/<attempt>`; every process below it inherits it
  (vLLM's engine processes, torchrun and its ranks, whatever comes later). A scan of
  /proc/*/environ finds them all, also after they were re-parented to init and when they
  lead sessions of their own (torchrun puts each rank in a new session, so process groups
  cannot find them). `kill_tagged` SIGKILLs every live process with the tag, repeatedly,
  until none is left. It is called by the supervisor when the stage ends (by any signal: a
  SIGKILLed stage runs no cleanup, its supervisor does), by the stage itself when its worker
  dies (`watch_parent`), and before a new attempt of a job starts (`kill_tagged` of the job's
  prefix: leftovers of a killed attempt are gone before the retry touches the job's folder).
- **PR_SET_PDEATHSIG on what we spawn** (`spawn`): the kernel signals a child when the thread
  that started it dies, even by SIGKILL, which covers the case where the stage and its worker
  die together and nobody is left to scan. Code that something else starts (torchrun's
  ranks) arms it itself (`bind_to_parent`) and checks that its parent still carries the tag.
- **Why not a cgroup:** cgroup.kill (v2) or a freezer (v1) would contain escapes the tag
  cannot (a process that clears its environment: none of ours do), but the product runs in
  containers where /sys/fs/cgroup is read-only, so it would be a second path that only some
  deployments take and the tests would exercise only one of; the tag works the same
  everywhere. **Why not a subreaper:** it only changes who inherits orphans; the stage would
  then have to reap them, and the tag scan finds them wherever they were re-parented.

Why groups as well: `spawn` puts each child in a session (group) of its own, so a graceful
stop (SIGTERM, a grace, SIGKILL) reaches what it started without reaching its parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

_PR_SET_PDEATHSIG = 1

# The attempt a process belongs to: "<deployment>/<job id>/<attempt>" (see attempt_tag).
TAG_ENV = "DRAFTYARD_ATTEMPT"
# The pid of the process that supervises a stage (set by workers/supervisor.py).
PARENT_ENV = "DRAFTYARD_SUPERVISOR_PID"


def _prctl_pdeathsig(sig: int) -> bool:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig) == 0
    except (OSError, AttributeError):
        return False  # not Linux: the parent's own cleanup has to do


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A `preexec_fn`: the child gets `sig` when the process that started it dies, even by
    SIGKILL (Linux; elsewhere a no-op, and the parent's own cleanup has to do)."""
    parent = os.getpid()

    def preexec() -> None:  # runs in the child between fork and exec
        if not _prctl_pdeathsig(sig):
            return
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), sig)
    return preexec


def spawn(cmd: Sequence[str], *, env: dict[str, str] | None = None, cwd: str | Path | None = None,
          log: Path | None = None, stdout: int | IO[Any] | None = None,
          stderr: int | IO[Any] | None = None, stdin: int | IO[Any] | None = subprocess.DEVNULL,
          death_signal: int | None = signal.SIGKILL, text: bool = False) -> subprocess.Popen:
    """Start `cmd` the one way draftyard starts processes: in a session (process group) of its
    own, so a stop reaches everything it starts; with `death_signal` sent by the kernel when
    the starting thread dies, even by SIGKILL (None: the caller watches instead, e.g. a stage
    started from a worker's pool thread, see watch_parent); inheriting the environment, and
    with it the attempt tag. `log`: append stdout and stderr to this file."""
    fh = open(log, "ab") if log is not None else None  # noqa: SIM115  the child keeps it
    try:
        return subprocess.Popen(
            list(cmd), env=env, cwd=None if cwd is None else str(cwd), stdin=stdin,
            stdout=fh if fh is not None else stdout,
            stderr=subprocess.STDOUT if fh is not None else stderr, text=text,
            start_new_session=True,
            preexec_fn=die_with_parent(death_signal) if death_signal else None)
    finally:
        if fh is not None:
            fh.close()


def fork_child(death_signal: int = signal.SIGKILL) -> int:
    """`os.fork()` the one way a warm server starts a child (workers/stages/starter.py):
    the child in a process group of its own (stopping it reaches what it started), with
    `death_signal` when the forking process dies (call it from a single-threaded server: the
    signal is tied to the forking thread). 0 in the child, the child's pid in the parent."""
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        if _prctl_pdeathsig(death_signal) and os.getppid() != parent:
            os.kill(os.getpid(), death_signal)  # the server died before the signal was armed
        return 0
    with contextlib.suppress(OSError):  # both sides, so no signal finds the group unmade
        os.setpgid(pid, pid)
    return pid


# --- a forked child's identity in /proc (a warm starter's children, workers/stages/starter.py)
#
# /proc/<pid>/environ and /proc/<pid>/cmdline show the environment block and the arguments a
# process was exec'd with, and a forked child keeps its parent's: setting os.environ in the
# child changes what it passes on, not what the scan above (or a look at `ps`) reads. So a warm
# starter is exec'd with the tag set to TAG_SLOT and a last argument ARGV_SLOT, placeholders
# with room to spare, and each child writes its own entries (its attempt's tag, its job id)
# over the tag's slot and its own command line over the arguments, in its own copy of the
# memory (/proc/self/mem, the way setproctitle rewrites argv). From then on the child is
# found by the same scans as every other process of its attempt.

TAG_SLOT = "unassigned" + "." * 502
ARGV_SLOT = "." * 512


def _area(first: int) -> tuple[int, int] | None:
    """(start, end) address of this process's exec-time arguments (first=48) or environment
    (first=50), from /proc/self/stat (Linux >= 3.5), or None."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[first - 3]), int(fields[first - 2])
    except (OSError, IndexError, ValueError):
        return None


def _write_own(at: int, data: bytes) -> bool:
    try:
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(at)
            mem.write(data)
        return True
    except OSError:
        return False


def _read_own(start: int, end: int) -> bytes | None:
    try:
        with open("/proc/self/mem", "rb", buffering=0) as mem:
            mem.seek(start)
            return mem.read(end - start)
    except OSError:
        return None


def env_slot() -> tuple[int, int] | None:
    """(address, length) of the TAG_ENV entry ("NAME=value") in this process's exec-time
    environment block, or None."""
    area = _area(50)
    raw = None if area is None else _read_own(*area)
    if area is None or raw is None:
        return None
    key = f"{TAG_ENV}=".encode()
    at = 0 if raw.startswith(key) else raw.find(b"\0" + key) + 1
    if at <= 0 and not raw.startswith(key):
        return None
    return area[0] + at, raw.index(b"\0", at) - at


def proc_environ_bytes(entries: object) -> bytes | None:
    """What set_proc_environ writes for `entries` ("NAME=value" joined by NULs), or None
    when they cannot be written: not a dict of strings with TAG_ENV first, a NUL anywhere,
    a '=' in a name."""
    if not isinstance(entries, dict) or next(iter(entries), None) != TAG_ENV or not all(
            isinstance(k, str) and isinstance(v, str) and "\0" not in k + v and "=" not in k
            for k, v in entries.items()):
        return None
    return b"\0".join(f"{k}={v}".encode() for k, v in entries.items())


def set_proc_environ(entries: dict[str, str]) -> bool:
    """Write `entries` (TAG_ENV first) over this process's exec-time TAG_ENV entry,
    NUL-padded (the rest of the slot reads as nothing); True when /proc/self/environ now shows
    each of them. False, and nothing changed, without a slot long enough or /proc/self/mem."""
    slot = env_slot()
    data = proc_environ_bytes(entries)
    if slot is None or data is None or len(data) > slot[1]:
        return False
    if not _write_own(slot[0], data + b"\0" * (slot[1] - len(data))):
        return False
    seen = _environ("self") or {}
    return all(seen.get(k) == v for k, v in entries.items())


def set_proc_cmdline(argv: Sequence[str]) -> bool:
    """Write `argv` over this process's exec-time arguments, NUL-padded, when it fits (a
    warm starter's last argument is ARGV_SLOT): /proc/self/cmdline and `ps` then show it."""
    area = _area(48)
    data = b"\0".join(a.encode() for a in argv) + b"\0"
    if area is None or len(data) > area[1] - area[0] or any("\0" in a for a in argv):
        return False
    return _write_own(area[0], data + b"\0" * (area[1] - area[0] - len(data)))


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (the kernel's pick); the server binds it moments later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def signal_group(pgid: int, sig: int) -> None:
    """Signal a process group that may be gone already."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


# --- the attempt tag ----------------------------------------------------------------------

def attempt_tag(deployment: str, job_id: str, attempt: int | None) -> str:
    """The tag of one attempt of one job of one deployment (its home: two deployments on one
    machine may share job ids' shapes, never their processes)."""
    return f"{job_tag(deployment, job_id)}{attempt}"


def job_tag(deployment: str, job_id: str) -> str:
    """The prefix every attempt's tag of this job starts with (ends with '/')."""
    scope = hashlib.sha256(str(deployment).encode()).hexdigest()[:12]
    return f"{scope}/{job_id}/"


def _environ(pid: int | str) -> dict[str, str] | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return None  # exited while we looked, or not ours to read
    return dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)


def _state(pid: int | str) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _matches(value: str | None, tag: str) -> bool:
    """`tag` names one attempt; a tag ending in '/' (job_tag) names every attempt of a job."""
    return value is not None and (value == tag or (tag.endswith("/") and value.startswith(tag)))


def tagged(tag: str) -> list[int]:
    """Live (non-zombie) processes carrying `tag` (see _matches), from /proc; [] without."""
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    found = []
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        env = _environ(d.name)
        if env is not None and _matches(env.get(TAG_ENV), tag) and _state(d.name) not in (
                None, "Z", "X"):
            found.append(int(d.name))
    return found


def kill_tagged(tag: str, wait_s: float = 5.0, spare: Sequence[int] = ()) -> list[int]:
    """SIGKILL every live process carrying `tag` but this one (and `spare`), again and again
    until none is left (one may fork while we scan) or `wait_s` passed; returns the pids
    killed. SIGKILL, not SIGTERM: what is left of an attempt whose stage is gone must not go
    on writing (a torchrun rank told to stop would checkpoint first)."""
    keep = {os.getpid(), *spare}
    killed: set[int] = set()
    deadline = time.monotonic() + wait_s
    while True:
        pids = [p for p in tagged(tag) if p not in keep]
        if not pids or time.monotonic() > deadline:
            return sorted(killed)
        for p in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        killed.update(pids)
        time.sleep(0.02)


def bind_to_parent(sig: int = signal.SIGKILL) -> None:
    """For our code that something else started (torchrun's ranks): die with the parent,
    even when it is SIGKILLed. If the parent died before the death signal was armed, we were
    re-parented already: the new parent does not carry our attempt's tag, so die now."""
    tag = os.environ.get(TAG_ENV)
    if not _prctl_pdeathsig(sig) or not tag:
        return
    if (_environ(os.getppid()) or {}).get(TAG_ENV) != tag:
        os.kill(os.getpid(), sig)


def watch_parent(poll_s: float = 0.5) -> None:
    """Kill this attempt (every process with its tag: torchrun's ranks in their own sessions
    too) and then this process's whole group as soon as the supervising worker process is
    gone. PR_SET_PDEATHSIG cannot do this: it fires when the *thread* that forked us exits
    (Celery pool threads outlive a failed supervisor and a worker process outlives them).
    No-op when run alone from a shell."""
    want = os.environ.get(PARENT_ENV)
    if not want or not want.isdigit():
        return

    def _watch() -> None:
        # getppid() changes when the parent dies (we are re-parented), also if it died
        # before this thread started: compare with the pid recorded at spawn.
        while os.getppid() == int(want):
            time.sleep(poll_s)
        tag = os.environ.get(TAG_ENV)
        if tag:
            kill_tagged(tag)
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
        env = _environ(d.name)
        try:
            if env is not None and pred(env) and (pgid := os.getpgid(int(d.name))) != me:
                found.add(pgid)
        except OSError:
            continue  # exited while we looked
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


class AttemptProcesses:
    """The processes of one attempt of a job (what the worker's supervisor starts): `start`
    first kills whatever an earlier attempt of the job left, then starts the stage with the
    attempt's tag and the supervisor's pid (watch_parent) in its environment; `sweep`, once
    the stage has ended by any means, kills every process left with the tag."""

    def __init__(self, deployment: str, job_id: str, attempt: int | None):
        self.tag = attempt_tag(deployment, job_id, attempt)
        self.job = job_tag(deployment, job_id)
        self.proc: Any = None  # a Popen, or a procgroup.warm.WarmChild
        self.stale: list[int] = []  # what start killed of earlier attempts

    def start(self, cmd: Sequence[str], *, env: dict[str, str], cwd: str | Path | None = None,
              log: Path | None = None,
              warm: Callable[[dict[str, str]], Any] | None = None) -> Any:
        """Start the stage: `warm(env)` first when given (a warm starter's child, or None
        when it cannot), else `cmd` in a fresh process. Either carries the attempt's tag."""
        self.stale = kill_tagged(self.job)
        env = {**env, TAG_ENV: self.tag, PARENT_ENV: str(os.getpid())}
        self.proc = warm(env) if warm is not None else None
        if self.proc is None:
            # No death signal: it would be tied to the calling thread (a worker's pool
            # thread); watch_parent ties the stage to this process instead.
            self.proc = spawn(cmd, env=env, cwd=cwd, log=log, death_signal=None)
        return self.proc

    def sweep(self) -> list[int]:
        """SIGKILL the stage's group and everything else of the attempt (torchrun's ranks in
        their own sessions, orphans re-parented to init); returns the pids killed."""
        if self.proc is not None:
            signal_group(self.proc.pid, signal.SIGKILL)
        return kill_tagged(self.tag)
