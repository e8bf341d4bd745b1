"""Stopping the embedded service (`draftyard up`) ends its worker and every stage within seconds,
and a running stage's job is requeued (not failed) for the next `draftyard up` to continue; a
production worker told to stop (SIGTERM) does the same instead of waiting for a long stage.

Each test starts `draftyard up` with a home of its own; its processes (API, worker, warm
starters, stages) all carry that home in their environment, which is how /proc finds what is
left of them."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import Proc, free_port, wait_for, wait_ready

# From the signal to the last process of the tree gone. Measured on 2 cores: 4.3-4.9 s, most
# of it Celery's own shutdown (its consumer polls the filesystem broker for up to 2 s); the
# stage is gone in 0.25 s (a probe exits on SIGTERM; one that ignores it gets stop_grace_s,
# 5 s). Before, the worker waited for the stage (here ten minutes).
GONE_S = 15.0


def _left(home: Path) -> list[int]:
    """Live processes whose environment names `home` (every process of that `draftyard up`)."""
    want = f"DRAFTYARD_HOME={home}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if want not in (d / "environ").read_bytes().split(b"\0"):
                continue
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            found.append(int(d.name))
    return found


class Up:
    """One `draftyard up` on `home` (SQLite, the filesystem broker)."""

    def __init__(self, home: Path, log: Path):
        env = {k: v for k, v in os.environ.items()
               if k not in ("DRAFTYARD_DATABASE_URL", "DRAFTYARD_BROKER_URL")}
        env["DRAFTYARD_HOME"] = str(home)
        self.home = home
        self.url = f"http://127.0.0.1:{free_port()}"
        self.proc = Proc([sys.executable, "-m", "app.cli.main", "up", "--port",
                          self.url.rsplit(":", 1)[1]], log, full_env=env)
        wait_ready(self.url, self.proc, 90, "draftyard up")
        token = (home / "admin_token").read_text().strip()
        self.c = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"},
                              timeout=10)

    def job(self, job_id: str) -> dict:
        return self.c.get(f"/v1/jobs/{job_id}").json()

    def stage_pid(self, job_id: str, attempt: int = 1) -> int:
        """The pid of the stage of the job's `attempt`-th start, once it has started."""
        def pid():
            pids = [int(e["data"]["message"].rsplit(" ", 1)[1])
                    for e in self.c.get(f"/v1/jobs/{job_id}/events").json()["data"]
                    if e["kind"] == "log" and "stage started" in e["data"].get("message", "")]
            return pids[attempt - 1] if len(pids) >= attempt else None
        return wait_for(pid, 60, 0.1, f"stage {attempt} to start")

    def stop(self) -> None:
        """The clean way (SIGTERM), and whatever is left after GONE_S killed."""
        self.proc.kill(signal.SIGTERM)
        try:
            wait_for(lambda: not _left(self.home), GONE_S, 0.2, "draftyard up to stop")
        finally:
            for pid in _left(self.home):
                os.kill(pid, signal.SIGKILL)


def _db_job(home: Path, job_id: str) -> tuple[str, int]:
    with sqlite3.connect(home / "draftyard.db") as db:
        row = db.execute("SELECT status, attempt FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return row[0], row[1]


def _signal_up(up: Up, how: str) -> None:
    pid = up.proc.pid  # `up` leads its own process group (Proc)
    if how == "sigterm":  # as measured: the group gets SIGTERM, then SIGKILL a second later
        os.killpg(pid, signal.SIGTERM)
        time.sleep(1.0)
        with contextlib.suppress(ProcessLookupError):  # it may have exited meanwhile
            os.killpg(pid, signal.SIGKILL)
    elif how == "ctrl-c":  # the terminal sends SIGINT to its foreground group
        os.killpg(pid, signal.SIGINT)
    elif how == "sigkill":  # `draftyard up` itself, nothing else
        os.kill(pid, signal.SIGKILL)
    elif how == "hangup":  # its terminal closed
        os.killpg(pid, signal.SIGHUP)


@pytest.mark.parametrize("how", ["sigterm", "sigkill", "hangup", "ctrl-c"])
def test_stopping_draftyard_up_ends_every_stage_and_requeues_the_job(tmp_path, how):
    home = tmp_path / "home"
    up = Up(home, tmp_path / "up.log")
    try:
        job = up.c.post("/v1/jobs", json={"type": "probe", "params": {
            "sleep_s": 600, "steps": 600, "import_torch": False}}).json()
        stage = up.stage_pid(job["id"])
        tree = _left(home)  # API, worker, the data stages' warm starter, the stage
        assert stage in tree and len(tree) >= 3, tree
        t0 = time.monotonic()
        _signal_up(up, how)
        wait_for(lambda: not _left(home), GONE_S, 0.1,
                 f"every process of draftyard up gone after {how}")
        took = time.monotonic() - t0
        print(f"draftyard up, {how}: its {len(tree)} processes gone {took:.2f} s after it")
        up.proc.p.wait(5)
        status, attempt = _db_job(home, job["id"])
        # requeued by its worker as it stopped, as the next attempt: not failed, not running
        assert (status, attempt) == ("queued", 2), (status, attempt, took,
                                                    (home / "worker.log").read_text()[-3000:])
        if how == "sigterm":
            # The next `draftyard up` on the same home runs it again.
            up = Up(home, tmp_path / "up2.log")
            j = wait_for(lambda: (x := up.job(job["id"]))["status"] == "running" and x, 60,
                         0.2, "the job to run again")
            assert j["attempt"] == 2 and j["error"] is None, j
            assert up.stage_pid(job["id"], 2) != stage
            up.c.post(f"/v1/jobs/{job['id']}/cancel")
    finally:
        up.stop()


def test_a_worker_told_to_stop_stops_its_stages_now_and_requeues_their_jobs(api, gpu_workers):
    """`draftyard worker` on SIGTERM (a deploy, `docker stop`): Celery's warm shutdown would
    wait for the stage to end (here ten minutes); the worker stops it instead, requeues its
    job without spending an attempt, and is gone within seconds."""
    w = gpu_workers.start("stop1")  # one declared GPU: the job lands here, not on `w1`
    job = api.submit(type="probe", gpus=1,
                     params={"sleep_s": 600, "steps": 600, "import_torch": False})
    stage = wait_for(lambda: next((int(e["data"]["message"].rsplit(" ", 1)[1])
                                   for e in api.get(f"/v1/jobs/{job['id']}/events").json()["data"]
                                   if e["kind"] == "log"
                                   and "stage started" in e["data"].get("message", "")), None),
                     60, 0.1, "the stage to start")
    t0 = time.monotonic()
    os.kill(w.pid, signal.SIGTERM)
    w.p.wait(GONE_S)
    assert not Path(f"/proc/{stage}").exists() or \
        (Path(f"/proc/{stage}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX")
    j = api.job(job["id"])
    assert j["status"] == "queued" and j["attempt"] == 2 and j["error"] is None, j
    evs = api.get(f"/v1/jobs/{job['id']}/events").json()["data"]
    assert any("stopped (SIGTERM)" in e["data"].get("reason", "")
               for e in evs if e["kind"] == "status"), evs
    node = next(n for n in api.get("/v1/nodes").json()["data"] if n["name"] == "stop1")
    assert not node["schedulable"], node  # no new work placed on a stopping worker
    assert time.monotonic() - t0 < GONE_S
    from app.core.db import unit_of_work
    from app.models import Job

    with unit_of_work() as s:  # not a fault of the job: its budget of retries stays whole
        row = s.get_one(Job, job["id"])
        assert row.max_attempts - row.attempt == 3 - 1, (row.attempt, row.max_attempts)
    assert api.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
