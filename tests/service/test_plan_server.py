"""The API's warm plan server (workers/stages/starter.py): plans are forked from a
process that has the stage core imported, one child per plan; a dead server is replaced and
costs no plan; a plan that runs past its time is killed with what it started."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import _HOME, REPO, wait_for
from tests.service.test_runs import _body, _dataset, _records


@pytest.fixture(scope="module")
def target(api, home):
    from tests.tiny import tiny_model

    d = tiny_model(home / "models" / "tiny-plan-server", arch="qwen3")
    r = api.post("/v1/targets", {"name": "tiny-plan-server", "path": str(d)})
    assert r.status_code == 201, r.text
    return r.json()


def _cmdline(pid: int | str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _ppid(pid: int | str) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _gone(pid: int) -> bool:
    """Exited (a zombie or reaped): a process being killed loses its cmdline before that."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _plan_servers(api_port: str) -> list[int]:
    """The plan servers whose parent is this session's API process."""
    return [int(d) for d in os.listdir("/proc") if d.isdigit()
            and "workers.stages.starter --profile plan" in _cmdline(d)
            and f"--port {api_port} " in _cmdline(_ppid(d)) + " "]


def _served(log: Path) -> list[str]:
    return [x for x in log.read_text().splitlines() if x.startswith("plan ")] \
        if log.exists() else []


def _same(a: list[dict], b: list[dict]) -> bool:
    """The same checks, but for the free space the disk check reads (other tests and
    processes write to the same disk between two plans)."""
    def key(checks):
        return [{**c, "message": re.sub(r"[\d.]+ \w+ free", "N free", c["message"])}
                if c.get("name") == "disk" else c for c in checks]
    return key(a) == key(b)


def test_plans_are_forked_warm_and_a_dead_server_costs_no_plan(api, worker, target, home):
    port = api.url.rsplit(":", 1)[1]
    log = _HOME / "plans" / "server.log"
    body = _body(target, _dataset(api, home, "plan-server", _records(8)))
    r = api.post("/v1/plans", body, timeout=180)
    assert r.status_code == 200, r.text
    first = r.json()
    (server,) = _plan_servers(port)
    before = len(_served(log))
    again = api.post("/v1/plans", body, timeout=180).json()
    # The same server forked this plan too: one more line in its log, and the same plan.
    assert _plan_servers(port) == [server]
    assert len(_served(log)) == before + 1, _served(log)[-3:]
    assert _same(again["checks"], first["checks"]) and again["ok"] == first["ok"]

    os.kill(server, signal.SIGKILL)
    wait_for(lambda: _gone(server), 10, 0.05, "the server to be gone")
    r = api.post("/v1/plans", body, timeout=180)
    assert r.status_code == 200, r.text
    assert _same(r.json()["checks"], first["checks"])
    (new,) = _plan_servers(port)
    assert new != server


def test_a_plan_past_its_time_is_killed_and_the_server_goes_on(tmp_path):
    """A spec that never arrives (a FIFO nobody writes) holds the plan forever: the server
    kills it at its deadline, answers `timed_out`, and serves the next request."""
    sock = tmp_path / "s" / "plan.sock"
    sock.parent.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-m", "workers.stages.starter", "--profile", "plan",
                          "--socket", str(sock)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                         text=True)
    try:
        wait_for(sock.exists, 60, 0.05, "the plan server to listen")

        def ask(spec: Path, timeout_s: float, stage: str = "plan") -> dict:
            with socket.socket(socket.AF_UNIX) as c:
                c.settimeout(30)
                c.connect(str(sock))
                c.sendall(json.dumps({"stage": stage, "spec": str(spec), "cwd": str(tmp_path),
                                      "timeout_s": timeout_s}).encode() + b"\n")
                f = c.makefile("rb")
                first = json.loads(f.readline())
                if "pid" not in first:
                    return first
                assert isinstance(first["pid"], int)
                return json.loads(f.readline())

        # It starts only what its profile allows: a plan server runs no train.
        assert "not 'train'" in ask(tmp_path / "x.json", 5, stage="train")["error"]

        fifo = tmp_path / "spec.json"
        os.mkfifo(fifo)
        t0 = time.monotonic()
        assert ask(fifo, 1.0) == {"rc": -signal.SIGKILL, "timed_out": True}
        assert time.monotonic() - t0 < 10
        # the next plan runs: a missing spec is the stage's own clear failure (status 1 or 2)
        answer = ask(tmp_path / "missing.json", 30)
        assert answer["timed_out"] is False and answer["rc"] in (1, 2), answer
        assert "missing.json" in (tmp_path / "stderr.txt").read_text()
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(10)
    assert not sock.exists() and not sock.parent.exists()  # it cleans up after itself
    assert "timed out" in p.stdout.read()


def test_a_server_that_cannot_start_is_not_retried_on_every_plan(tmp_path, monkeypatch):
    """A broken server start (here: a program that exits at once) makes the caller start
    fresh processes, and it does not try again on the next request, only after
    RETRY_AFTER_S."""
    import procgroup.warm as warm

    starts = []
    real_spawn = warm.spawn

    def counting_spawn(cmd, **kw):
        starts.append(cmd)
        return real_spawn(cmd, **kw)

    monkeypatch.setattr(warm, "spawn", counting_spawn)
    ps = warm.WarmStarter("plan", ["/bin/false"], env=lambda: dict(os.environ),
                          log_path=lambda: tmp_path / "server.log")
    req = {"stage": "plan", "spec": str(tmp_path / "spec.json"), "cwd": str(tmp_path)}
    try:
        assert ps.start(req) is None and len(starts) == 1
        assert ps.start(req) is None and len(starts) == 1  # not again
        monkeypatch.setattr(warm.WarmStarter, "RETRY_AFTER_S", 0.0)
        assert ps.start(req) is None and len(starts) == 2  # later, again
    finally:
        ps.stop()
