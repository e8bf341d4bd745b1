"""A probe job through the real API, broker (Redis, or the filesystem's in embedded mode),
Celery worker and a supervised child, on both backends (tests/conftest.py both_backends)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.conftest import wait_for

pytestmark = pytest.mark.both_backends


def test_probe_runs_to_success_with_events_log_and_progress(api, worker):
    job = api.submit(type="probe", params={"sleep_s": 1.0, "steps": 5})
    assert job["status"] in ("queued", "dispatched", "running")
    seen = set()
    progress_points = set()
    deadline = time.time() + 60
    while time.time() < deadline:
        j = api.job(job["id"])
        seen.add(j["status"])
        if j["progress"]:
            progress_points.add(j["progress"]["done"])
        if j["status"] in ("succeeded", "failed"):
            break
        time.sleep(0.1)
    assert j["status"] == "succeeded", j
    assert "running" in seen
    assert len(progress_points) >= 2, progress_points  # progress moved while we watched
    assert j["metrics_summary"]["cuda_visible_devices"] == ""
    evs = api.get(f"/v1/jobs/{job['id']}/events").json()["data"]
    statuses = [e["data"]["to"] for e in evs if e["kind"] == "status" and "to" in e["data"]]
    assert statuses[:1] == ["pending"] and statuses[-1] == "succeeded"
    assert "queued" in statuses and "running" in statuses
    assert [e["seq"] for e in evs] == sorted(e["seq"] for e in evs)
    assert any(e["kind"] == "progress" for e in evs)
    log = api.get(f"/v1/jobs/{job['id']}/logs", params={"tail": 50}).text
    assert "probe facts" in log
    m = api.get(f"/v1/jobs/{job['id']}/metrics").json()
    assert [p[0] for p in m["tick"]] == [1, 2, 3, 4, 5]
    # after_seq pages the events
    later = api.get(f"/v1/jobs/{job['id']}/events", params={"after_seq": evs[2]["seq"]}).json()["data"]
    assert later[0]["seq"] == evs[3]["seq"]


def test_failing_probe_reports_typed_error_and_log_tail(api, worker):
    job = api.submit(type="probe", params={"fail": True, "steps": 1, "import_torch": False})
    j = api.wait_job(job["id"])
    assert j["status"] == "failed"
    assert j["error"]["code"] == "probe_failed"
    assert "probe facts" in j["error"]["log_tail"]


def test_cancel_running_probe_kills_group_within_5s(api, worker, home):
    job = api.submit(type="probe", params={"sleep_s": 60, "steps": 60})
    api.wait_job(job["id"], ("running",), 30)
    pid = wait_for(lambda: next((int(e["data"]["message"].rsplit(" ", 1)[1])
                                 for e in api.get(f"/v1/jobs/{job['id']}/events").json()["data"]
                                 if e["kind"] == "log" and "pid" in e["data"].get("message", "")),
                                None), 20, 0.2, "stage pid")
    r = api.post(f"/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelling"
    j = api.wait_job(job["id"], ("cancelled",), 5)  # the bound: cancelled within 5 s
    assert j["status"] == "cancelled"

    def gone():
        try:
            os.killpg(pid, 0)
            return False
        except ProcessLookupError:
            return True
    wait_for(gone, 3, 0.1, "the stage's process group to be gone")
    # idempotent on cancelled; 409 on a finished job
    assert api.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200


def _stage_pids(api, job_id: str) -> list[int]:
    """The pids of the job's stages, one per attempt started, from its events."""
    return [int(e["data"]["message"].rsplit(" ", 1)[1])
            for e in api.get(f"/v1/jobs/{job_id}/events").json()["data"]
            if e["kind"] == "log" and "stage started" in e["data"].get("message", "")]


def _sampled(api, job_id: str) -> None:
    """Wait until the supervisor has read a progress event of this attempt: its watch loop
    has then sampled the stage's memory at least once (each round samples, then reads)."""
    wait_for(lambda: ((api.job(job_id).get("progress") or {}).get("done") or 0) >= 1, 30, 0.1,
             "the attempt's first progress")


def test_a_stage_killed_from_outside_is_retried_once_then_fails_naming_signal_and_memory(
        api, worker):
    """What the kernel's OOM killer does (SIGKILL, no word in the stage's log), done by hand:
    the first death requeues the job (an infrastructure fault) with the signal and the memory
    figures; the second fails it with them."""
    job = api.submit(type="probe", params={"sleep_s": 120, "steps": 120, "import_torch": False})
    first = wait_for(lambda: _stage_pids(api, job["id"]), 30, 0.1, "stage pid")[0]
    _sampled(api, job["id"])
    os.kill(first, signal.SIGKILL)
    j = wait_for(lambda: (x := api.job(job["id"]))["attempt"] == 2 and
                 x["status"] in ("queued", "dispatched", "running") and x, 15, 0.1,
                 "the job to be requeued as attempt 2")
    evs = api.get(f"/v1/jobs/{job['id']}/events").json()["data"]
    killed = [e["data"] for e in evs if e["kind"] == "warning"
              and e["data"].get("code") == "stage_killed"]
    assert len(killed) == 1, evs
    k = killed[0]
    assert k["signal"] == "SIGKILL" and "SIGKILL" in k["message"], k
    assert "Peak memory" in k["message"] and "available of" in k["message"], k
    mem = k["memory"]
    # the probe is a python process: tens of MB at its peak, on a node with far more
    assert 5 * 2**20 < mem["peak_bytes"] < mem["node_total_bytes"], mem
    assert 0 < mem["node_available_bytes"] <= mem["node_total_bytes"], mem
    requeued = [e["data"] for e in evs if e["kind"] == "status"
                and e["data"].get("to") == "queued" and "SIGKILL" in e["data"].get("reason", "")]
    assert requeued, evs

    second = wait_for(lambda: (p := _stage_pids(api, job["id"]))[1:] and p[1], 30, 0.1,
                      "the second attempt's stage pid")
    assert second != first
    _sampled(api, job["id"])
    os.kill(second, signal.SIGKILL)
    j = api.wait_job(job["id"], timeout=15)
    assert j["status"] == "failed" and j["attempt"] == 2, j
    assert j["error"]["code"] == "stage_killed"
    msg = j["error"]["message"]
    assert "SIGKILL" in msg and "Peak memory" in msg and "MiB" in msg, msg
    assert j["error"]["details"]["memory"]["peak_bytes"] > 5 * 2**20, j["error"]
    print("the job's error:", msg)


@pytest.mark.postgres_only("sends the duplicates in-process, through the session's broker")
def test_duplicate_delivery_runs_once(api, worker, home):
    from app.core.broker import send_run_job

    # Running for 2 s when the duplicates come (without torch's import, ~3 s of CPU, that
    # took the time before).
    job = api.submit(type="probe", params={"sleep_s": 2.0, "steps": 2, "import_torch": False})
    api.wait_job(job["id"], ("running", "succeeded"), 30)
    send_run_job(job["id"], "cpu")  # the same message again
    send_run_job(job["id"], "cpu")
    j = api.wait_job(job["id"])
    assert j["status"] == "succeeded"
    # The worker takes the cpu queue in order: once a job sent after the duplicates has
    # started, both duplicates have been taken and their claim found nothing.
    after = api.submit(type="probe", params={"sleep_s": 0.1, "steps": 1, "import_torch": False})
    assert api.wait_job(after["id"])["status"] == "succeeded"
    evs = api.get(f"/v1/jobs/{job['id']}/events").json()["data"]
    starts = [e for e in evs if e["kind"] == "log" and "stage started" in e["data"]["message"]]
    assert len(starts) == 1
    runs = [e for e in evs if e["kind"] == "status" and e["data"].get("to") == "running"]
    assert len(runs) == 1
    assert api.job(job["id"])["status"] == "succeeded"
