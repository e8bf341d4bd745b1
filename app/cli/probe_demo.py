"""A probe job end to end through the embedded service: starts it, submits, follows, stops."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx

from app.cli.client import Client
from app.cli.view import console, follow_jobs
from app.core.config import get_settings


def start_embedded(port: int) -> subprocess.Popen:
    s = get_settings()
    s.home.mkdir(parents=True, exist_ok=True)
    log = open(s.home / "server.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", "up", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 90
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the embedded service exited; see {s.home / 'server.log'}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the embedded service did not become ready in 90 s")


def stop(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)


def run_probe_demo(json_out: bool = False, port: int = 8765) -> int:
    proc = start_embedded(port)
    try:
        token = (get_settings().home / "admin_token").read_text().strip()
        c = Client(f"http://127.0.0.1:{port}", token)
        job = c.post("/v1/jobs", {"type": "probe", "params": {"sleep_s": 2, "steps": 10}})
        final = follow_jobs(c, [job["id"]], {job["id"]: "probe"})[0]
        console.print(f"probe {final['id']}: {final['status']}")
        if json_out:
            print(json.dumps({"job_id": final["id"], "status": final["status"]}))
        return 0 if final["status"] == "succeeded" else 1
    finally:
        stop(proc)
