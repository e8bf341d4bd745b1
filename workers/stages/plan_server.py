"""A warm starter for plans: `python -m workers.stages.plan_server --socket PATH`.

The API plans every run it is sent (and every `POST /v1/plans`) in a child process, because
the plan needs the tokenizer and the chat template (the stage core) and must not take the API
down with it. A fresh `python -m workers.stages plan` spends about 2.5 CPU-seconds importing
transformers' tokenizer classes, jinja2 and the stage core before it reads a byte; a busy
team's submissions, the CLI's `plan` and `init-run` pay it every time.

This server imports all of that once and then forks one child per plan. Each plan still runs
in a process of its own that exits when it is done (a crash, a hang or a memory blow-up of one
plan is that child's), from the server's clean state (the server itself never plans, so
nothing one plan loads or caches is seen by the next).

Protocol (one request per connection, JSON lines over a Unix socket):
  -> {"spec": "<spec.json>", "cwd": "<folder>", "timeout_s": 120}
  <- {"rc": <exit status; negative: killed by that signal>, "timed_out": bool}
The child's stdout and stderr go to `stdout.txt` and `stderr.txt` in `cwd`; the server's own
stdout gets one line per plan (`plan <pid> rc <status> <seconds> s <spec>`).

The server is single-threaded (a select loop), so forking it is safe; it exits when the
process that started it is gone (its parent pid changes) or on SIGTERM, and kills the plans it
started when it does. app/plans/service.py starts it and falls back to a plain child process
when it cannot reach it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import time
from pathlib import Path

from procgroup import fork_child, signal_group


def warm() -> None:
    """Import what every plan imports (the stage core, the tokenizer classes a folder's
    tokenizer loads as, the chat-template renderer), without loading any tokenizer."""
    import jinja2  # noqa: F401
    import transformers

    import workers.stages.__main__
    import workers.stages.plan  # noqa: F401

    for name in ("PreTrainedTokenizerFast", "TokenizersBackend", "Qwen2Tokenizer"):
        getattr(transformers, name, None)


def _child(sock: socket.socket, listener: socket.socket, req: dict) -> None:
    """In the forked child: become a plain plan process and never return."""
    rc = 1
    try:
        listener.close()
        sock.close()
        cwd = Path(req["cwd"])
        os.chdir(cwd)
        for fd, name in ((1, "stdout.txt"), (2, "stderr.txt")):
            f = os.open(cwd / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(f, fd)
            os.close(f)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115  the process's own stdout
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        from workers.stages.__main__ import main

        rc = main(["plan", "--spec", str(req["spec"])])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001  the plan's crash is this child's, reported by rc
        import traceback

        traceback.print_exc()
        rc = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(rc)


class Server:
    def __init__(self, path: Path, parent: int):
        self.path = path
        self.parent = parent
        self.sel = selectors.DefaultSelector()
        # pid -> (conn, deadline, started, spec)
        self.running: dict[int, tuple[socket.socket, float, float, str]] = {}
        self.stopping = False

    def listen(self) -> socket.socket:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # left by a server whose API died
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
        while not self.stopping and os.getppid() == self.parent:
            if self.sel.select(timeout=0.2):
                with contextlib.suppress(OSError):
                    conn, _addr = lst.accept()
                    self.start(conn, lst)
            self.reap()
            self.expire()
        for pid, (conn, *_) in self.running.items():
            signal_group(pid, signal.SIGKILL)
            conn.close()
        with contextlib.suppress(OSError):
            self.path.unlink()
            self.path.parent.rmdir()  # the starter's private folder, when nothing else is in it

    def start(self, conn: socket.socket, lst: socket.socket) -> None:
        conn.settimeout(5)
        try:
            with conn.makefile("rb") as f:
                req = json.loads(f.readline() or b"{}")
            if not isinstance(req, dict) or not req.get("spec") or not req.get("cwd"):
                raise ValueError("a request is {spec, cwd, timeout_s}")
        except (OSError, ValueError) as e:
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"error": str(e)}).encode() + b"\n")
            conn.close()
            return
        pid = fork_child()  # its own group: a timeout kills what the plan started, too
        if pid == 0:
            _child(conn, lst, req)
        now = time.monotonic()
        self.running[pid] = (conn, now + float(req.get("timeout_s") or 120), now,
                             str(req["spec"]))

    def _answer(self, pid: int, rc: int, timed_out: bool = False) -> None:
        conn, _deadline, started, spec = self.running.pop(pid)
        print(f"plan {pid} rc {rc}{' (timed out)' if timed_out else ''} "
              f"{time.monotonic() - started:.2f} s {spec}", flush=True)
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"rc": rc, "timed_out": timed_out}).encode() + b"\n")
        conn.close()

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
        for pid, (_conn, deadline, *_) in list(self.running.items()):
            if now > deadline:
                signal_group(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
                self._answer(pid, -signal.SIGKILL, timed_out=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workers.stages.plan_server")
    ap.add_argument("--socket", required=True, type=Path)
    args = ap.parse_args(argv)
    server = Server(args.socket, os.getppid())

    def _stop(signum, frame) -> None:
        server.stopping = True

    signal.signal(signal.SIGTERM, _stop)
    warm()
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
