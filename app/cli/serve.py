"""Starting the service: embedded (`draftyard up`) and production (`draftyard server`)."""

from __future__ import annotations

import atexit
import signal
import subprocess
import sys

import uvicorn

from app.cli.view import console
from app.core.config import get_settings
from procgroup import spawn, stop_group


def bootstrap(migrate: bool = True) -> None:
    """Close the home to other users, migrate (embedded) and create the first admin on an
    empty DB."""
    from app.core.db import unit_of_work
    from app.core.migrate import upgrade_head
    from app.core.private import private_home
    from app.users.service import ensure_admin

    s = get_settings()
    private_home(s.home)  # before anything is written there (app/core/private.py)
    s.home.mkdir(parents=True, exist_ok=True)
    if migrate:
        upgrade_head(s.db_url)
    with unit_of_work() as sess:
        if ensure_admin(sess, s.home):
            console.print(f"created the admin user; token in {s.home / 'admin_token'}")


def start_worker(node: str = "local", gpus: str | None = None) -> subprocess.Popen:
    argv = [sys.executable, "-m", "workers", "--node", node]
    if gpus:
        argv += ["--gpus", gpus]
    s = get_settings()
    # The worker stops with `up` however `up` ends: SIGTERM from `up`'s exit (atexit, after
    # uvicorn's graceful shutdown on SIGTERM or Ctrl-C), else from the kernel when `up` dies
    # (PR_SET_PDEATHSIG: SIGKILL, or the SIGHUP of its closed terminal). On SIGTERM the
    # worker stops its stages at once and requeues their jobs (workers/supervisor.py
    # request_stop); it is killed if it has not exited after their grace and a margin.
    proc = spawn(argv, log=s.home / "worker.log", stdin=None, death_signal=signal.SIGTERM)
    atexit.register(stop_group, proc, s.stop_grace_s + 10.0)
    return proc


def run_embedded(host: str, port: int, gpus: str | None) -> None:
    s = get_settings()
    console.print(f"draftyard embedded: home {s.home}, database {s.db_url}")
    bootstrap(migrate=True)
    start_worker("local", gpus)
    console.print(f"API on http://{host}:{port} (ready when GET /readyz answers 200); "
                  f"dashboard http://{host}:{port}/ui (token in {s.home / 'admin_token'})")
    uvicorn.run("app.main:create_app", factory=True, host=host, port=port, log_level="warning")


def run_server(host: str, port: int, workers: int, migrate: bool) -> None:
    bootstrap(migrate=migrate)
    uvicorn.run("app.main:create_app", factory=True, host=host, port=port, workers=workers,
                log_level="warning")
