"""A warm starter: `python -m workers.stages.starter --profile plan|model|data --socket PATH`.

A stage process spends most of a short job importing: a fresh `python -m workers.stages
train` imports torch, transformers and speculators (about 5 CPU-seconds on a quiet core here,
more on a busy one) before it reads a byte, and a whole run starts five to eight of them; a
plan imports transformers' tokenizer classes, jinja2 and the stage core (~2.5 CPU-s) for
every run submitted. This server imports a profile's modules once and then forks one child
per request. Each stage or plan still runs in a process of its own that exits when it is
done (a crash, a hang or a memory blow-up is that child's), from the server's clean state:
the server itself never runs a stage, so nothing one child loads or caches is seen by the
next, with one exception: the plan server loads each plan's target tokenizer before it forks
the plan (read-only, and loaded again when the folder's files change:
workers/stages/tokenizer_load.py `preload`), so that plans of one target skip that load.
Profiles:
- `plan` (the API's, app/plans/service.py): the plan's tokenizer and template core.
- `model` (each worker's, workers/supervisor.py): torch, transformers and speculators, for
  the stages that load a model (MODEL_STAGES: contracts/jobtypes.py `model_stage`).
- `data` (each worker's): pyarrow (and the pandas it imports on its first conversion), the
  stage core and the streaming stages (DATA_STAGES: contracts/jobtypes.py `streaming`), with
  their lean allocators in place before pyarrow was imported (memory.py), as a fresh stage
  has them. A
  fresh `python -m workers.stages ingest` spent ~0.6 CPU-s importing, as long as ingesting
  100K short records; a scale bench ingests six files. No model library is imported here, so
  memory.py's bounds still hold for its children. prepare keeps fresh processes (its
  tokenizer libraries).

A stage child is the process `python -m workers.stages <type>` would be: the request's
environment replaces the server's (CUDA_VISIBLE_DEVICES is read when CUDA starts, never
before: the server does not touch CUDA), its log gets stdout and stderr, and it carries its
attempt's tag and its job id where the scans of procgroup and the fault suite look for them
(/proc/<pid>/environ) and its own command line (`python -m workers.stages <type> --spec
...`, /proc/<pid>/cmdline): the server is started with placeholders for both
(procgroup.set_proc_environ, set_proc_cmdline). A server that cannot write them declines
tagged requests and the supervisor starts a fresh process instead.

The protocol is procgroup/warm.py's. The server is single-threaded (a select loop), so forking
it is safe, and each child gets a death signal tied to it (procgroup.fork_child). It exits
when the process that started it is gone (its parent pid changes) or on SIGTERM, and first
kills its children with everything of their attempts.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import selectors
import signal
import socket
import stat
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from contracts.jobtypes import MODEL_STAGES, STREAMING_STAGES
from procgroup import (
    TAG_ENV,
    TAG_SLOT,
    env_slot,
    fork_child,
    kill_tagged,
    proc_environ_bytes,
    set_proc_cmdline,
    set_proc_environ,
    signal_group,
)
from workers.stages.memory import lean_allocators

DATA_STAGES = STREAMING_STAGES
PROFILES = {"plan": frozenset({"plan"}), "model": MODEL_STAGES, "data": DATA_STAGES}


def _import_stages(profile: str) -> None:
    """The stage runner and the package of every stage the profile forks."""
    import workers.stages.__main__  # noqa: F401

    for stage in sorted(PROFILES[profile]):
        importlib.import_module(f"workers.stages.{stage}")


def warm(profile: str) -> None:
    """Import what the profile's children import, without loading a model or a tokenizer."""
    if profile == "data":
        # before pyarrow makes its default pool, as in a fresh stage; each child sets its
        # own stage's malloc thresholds (__main__)
        lean_allocators(export=False)
        import pyarrow as pa

        _import_stages(profile)
        pa.array(["x"])  # the first conversion of Python objects imports pandas (~0.2 s)
        return
    import jinja2  # noqa: F401
    import transformers

    if profile == "plan":
        _import_stages(profile)
        for name in ("PreTrainedTokenizerFast", "TokenizersBackend", "Qwen2Tokenizer"):
            getattr(transformers, name, None)
        return
    import torch  # noqa: F401
    from speculators.model import SpeculatorModel  # noqa: F401
    from speculators.models.eagle3.data import shift_batch  # noqa: F401
    from speculators.train.cli import create_transformer_layer_config  # noqa: F401
    from transformers import (  # noqa: F401
        AutoModelForCausalLM,
        AutoTokenizer,
        DynamicCache,
        GenerationConfig,
    )

    _import_stages(profile)
    for name in ("PreTrainedTokenizerFast", "TokenizersBackend", "Qwen2Tokenizer",
                 "Qwen3ForCausalLM", "Qwen3Config"):
        getattr(transformers, name, None)


def _preload_plan_tokenizer(spec_path: str) -> None:
    """Load the tokenizer of the plan's target in this server, so that the plan forked next
    inherits it (~0.5 CPU-s a plan for the Qwen3 tokenizer). Its paths are checked as the
    stage checks them; whatever goes wrong is the plan's to find and report. The spec is read
    only when it is a regular file (opened without blocking): this loop must never wait on
    a FIFO or a device, which a plan's own deadline handles in its child."""
    try:
        from contracts.resolved import PlanInputs
        from contracts.spec import StageSpec
        from workers.stages.common import check_roots
        from workers.stages.tokenizer_load import preload

        fd = os.open(spec_path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > 8 * 2**20:
                return
            with os.fdopen(os.dup(fd), "rb") as f:
                raw = f.read()
        finally:
            os.close(fd)
        spec = StageSpec.model_validate_json(raw)
        inputs = PlanInputs.model_validate(spec.inputs)
        check_roots(inputs, spec.roots)
        preload(inputs.target.tokenizer)
    except Exception:  # noqa: BLE001  the plan loads it (or fails) itself
        pass


def _redirect(fd: int, path: Path, append: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    f = os.open(path, flags, 0o600)
    os.dup2(f, fd)
    os.close(f)


def _child(sock: socket.socket, listener: socket.socket, req: dict,
           server_fds: tuple[socket.socket, ...] = ()) -> None:
    """In the forked child: become the process `python -m workers.stages <stage>` would be,
    and never return."""
    rc = 1
    try:
        signal.set_wakeup_fd(-1)  # the server's wake-up, not this process's
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for s in (listener, sock, *server_fds):
            s.close()
        if req.get("proc_env") and not set_proc_environ(req["proc_env"]):
            os._exit(3)  # cannot happen: the server checked its slot before forking
        set_proc_cmdline([sys.executable, "-m", "workers.stages", req["stage"], "--spec",
                          str(req["spec"])])
        cwd = Path(req["cwd"])
        os.chdir(cwd)
        if req.get("log"):
            _redirect(1, Path(req["log"]), append=True)
            os.dup2(1, 2)
        else:
            _redirect(1, cwd / "stdout.txt", append=False)
            _redirect(2, cwd / "stderr.txt", append=False)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        # Unbuffered, like PYTHONUNBUFFERED=1 in a fresh stage: its log is read while it runs.
        sys.stdout = io.TextIOWrapper(open(1, "wb", buffering=0, closefd=False),  # noqa: SIM115
                                      write_through=True)
        sys.stderr = io.TextIOWrapper(open(2, "wb", buffering=0, closefd=False),  # noqa: SIM115
                                      write_through=True)
        if isinstance(req.get("env"), dict):
            os.environ.clear()
            os.environ.update({str(k): str(v) for k, v in req["env"].items()})
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again (the attempt's scratch)
        from workers.stages.__main__ import main

        # No parent watch: the death signal ties this child to the server, which watches the
        # worker (a fresh stage watches its worker itself).
        rc = main([req["stage"], "--spec", str(req["spec"])], watch=False)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001  the child's crash is its own, reported by rc
        import traceback

        traceback.print_exc()
        rc = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(rc)


@dataclass
class _Running:
    """A child the server forked and has not reaped yet."""

    conn: socket.socket
    deadline: float | None
    started: float
    stage: str
    spec: str
    tag: str


class Server:
    def __init__(self, path: Path, parent: int, profile: str):
        self.path = path
        self.parent = parent
        self.stages = PROFILES[profile]
        self.sel = selectors.DefaultSelector()
        self.running: dict[int, _Running] = {}
        self.stopping = False
        self._wake: tuple[socket.socket, ...] = ()  # the wake-up socket pair (serve)
        # The tag's slot in this process's environment block: a child writes its entries
        # there (procgroup.set_proc_environ); without one, tagged requests are declined.
        # Names this block has already would be shown twice, so only new ones may be added.
        slot = env_slot() if os.environ.get(TAG_ENV) == TAG_SLOT else None
        self.slot_len = slot[1] if slot and set_proc_environ({TAG_ENV: TAG_SLOT}) else 0
        self.own_names = frozenset(os.environ) - {TAG_ENV}

    @property
    def can_tag(self) -> bool:
        return self.slot_len > 0

    def listen(self) -> socket.socket:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # left by a server whose parent died
        lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        lst.bind(str(tmp))
        os.chmod(tmp, 0o600)
        lst.listen(16)
        lst.setblocking(False)
        os.replace(tmp, self.path)  # appears whole: bound, private, listening
        self.sel.register(lst, selectors.EVENT_READ)
        return lst

    def serve(self) -> None:
        lst = self.listen()  # the socket's existence is the starter's sign that we are ready
        # A child's exit wakes the loop (its SIGCHLD writes to the wake-up socket), so that it
        # is reaped and answered at once, not at the next 0.2 s round: a forked ingest of a
        # small file is over in a few tenths of a second.
        wake, wake_w = self._wake = socket.socketpair()
        for s in self._wake:
            s.setblocking(False)
        self.sel.register(wake, selectors.EVENT_READ, "wake")
        signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        while not self.stopping and os.getppid() == self.parent:
            for key, _events in self.sel.select(timeout=0.2):
                if key.data == "wake":
                    with contextlib.suppress(OSError):
                        wake.recv(4096)
                    continue
                with contextlib.suppress(OSError):
                    conn, _addr = lst.accept()
                    self.start(conn, lst)
            self.reap()
            self.expire()
        for pid, child in self.running.items():
            signal_group(pid, signal.SIGKILL)
            if child.tag:
                kill_tagged(child.tag)
            child.conn.close()
        with contextlib.suppress(OSError):
            self.path.unlink()
            self.path.parent.rmdir()  # the starter's private folder, when nothing else is in it

    def _check(self, req: object) -> str | None:
        """Why this request is declined, or None."""
        if not isinstance(req, dict) or not req.get("spec") or not req.get("cwd"):
            return "a request is {stage, spec, cwd, timeout_s?, log?, env?, proc_env?}"
        if req.get("stage") not in self.stages:
            return f"this server starts {sorted(self.stages)}, not {req.get('stage')!r}"
        shown = req.get("proc_env")
        if shown is None:
            return None
        data = proc_environ_bytes(shown)
        if data is None or len(data) > self.slot_len or self.own_names & set(shown):
            return "this server cannot show these entries in its children's environment"
        return None

    def start(self, conn: socket.socket, lst: socket.socket) -> None:
        conn.settimeout(5)
        try:
            with conn.makefile("rb") as f:
                req = json.loads(f.readline() or b"{}")
            why = self._check(req)
        except (OSError, ValueError) as e:
            why = str(e)
        if why is not None:
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"error": why}).encode() + b"\n")
            conn.close()
            return
        if req["stage"] == "plan":
            _preload_plan_tokenizer(str(req["spec"]))
        pid = fork_child()  # its own group: a stop reaches what the child started, too
        if pid == 0:
            _child(conn, lst, req, self._wake)
        now = time.monotonic()
        timeout = req.get("timeout_s")
        self.running[pid] = _Running(conn, now + float(timeout) if timeout else None, now,
                                     req["stage"], str(req["spec"]),
                                     (req.get("proc_env") or {}).get(TAG_ENV, ""))
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")

    def _answer(self, pid: int, rc: int, timed_out: bool = False) -> None:
        child = self.running.pop(pid)
        print(f"{child.stage} {pid} rc {rc}{' (timed out)' if timed_out else ''} "
              f"{time.monotonic() - child.started:.2f} s {child.spec}", flush=True)
        with contextlib.suppress(OSError):
            child.conn.sendall(json.dumps({"rc": rc, "timed_out": timed_out}).encode() + b"\n")
        child.conn.close()

    def reap(self) -> None:
        while self.running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.running:
                self._answer(pid, os.waitstatus_to_exitcode(status))

    def expire(self) -> None:
        now = time.monotonic()
        for pid, child in list(self.running.items()):
            if child.deadline is not None and now > child.deadline:
                signal_group(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
                self._answer(pid, -signal.SIGKILL, timed_out=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workers.stages.starter")
    ap.add_argument("--profile", choices=sorted(PROFILES), required=True)
    ap.add_argument("--socket", required=True, type=Path)
    # Room for a child's command line (procgroup.ARGV_SLOT); its value is never read.
    ap.add_argument("--title-slot", default="")
    args = ap.parse_args(argv)
    server = Server(args.socket, os.getppid(), args.profile)

    def _stop(signum, frame) -> None:
        server.stopping = True

    signal.signal(signal.SIGTERM, _stop)
    warm(args.profile)
    if "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized():
        # An import started CUDA: a forked child could not use it. The caller starts fresh
        # processes instead (it sees this server exit).
        print("an import initialized CUDA; a warm starter cannot fork CUDA children", flush=True)
        return 1
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
