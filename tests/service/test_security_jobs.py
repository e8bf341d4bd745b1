"""No job held by a dead worker, and no member preempting others at
will."""

from __future__ import annotations

import signal
import time

import pytest
from sqlalchemy import text

from tests.conftest import REDIS_DBS, wait_for
from tests.service.test_api_errors import _err
from tests.service.stack import running


# ---- 4: a dead worker's jobs, when no worker is left --------------------------------------

@pytest.fixture
def lone():
    with running("reap", REDIS_DBS[1], {"DRAFTYARD_CPU_SLOTS": "2"},
                 workers={"lonenode": "0,1"}) as st:
        yield st


def test_the_api_requeues_a_dead_workers_job_and_frees_its_gpus(lone):
    """The only worker is SIGKILLed (its whole process group) and not restarted: the API
    process reaps the job within the stated bound (fence_s + one tick of its reaper)."""
    from app.core.config import Settings
    from app.scheduler.reaper import fence_s

    settings = Settings(_env_file=None, **{  # the stack's own settings
        k.removeprefix("DRAFTYARD_").lower(): v for k, v in lone.env.items()
        if k in ("DRAFTYARD_STALE_AFTER_S", "DRAFTYARD_HEARTBEAT_S")})
    # fence_s (the stage is surely dead by then) plus one tick of the API's reaper
    bound = fence_s(settings) + settings.heartbeat_s
    with lone.client() as c:
        r = c.post("/v1/jobs", json={"type": "probe", "gpus": 1, "params": {
            "sleep_s": 120, "import_torch": False}})
        assert r.status_code == 201, r.text
        jid = r.json()["id"]
        wait_for(lambda: c.get(f"/v1/jobs/{jid}").json()["status"] == "running", 60, 0.2,
                 "the probe running")
        held = [g for n in c.get("/v1/nodes").json()["data"] for g in n["gpus"]
                if g["job_id"] == jid]
        assert len(held) == 1
        worker = lone.procs[1]
        t_kill = time.monotonic()
        worker.kill(signal.SIGKILL)
        lone.procs.remove(worker)

        def requeued():
            j = c.get(f"/v1/jobs/{jid}").json()
            return j["status"] == "queued" and j
        job = wait_for(requeued, bound + 30, 0.2, "the lost job requeued by the API")
        took = time.monotonic() - t_kill
        print(f"requeued {took:.1f} s after the SIGKILL (bound {bound:.1f} s)")
        assert took <= bound + 3, (took, bound)  # + 3: HTTP polling and a loaded box
        assert job["attempt"] == 2
        events = c.get(f"/v1/jobs/{jid}/events").json()["data"]
        assert any(e["kind"] == "status" and "lost; requeued" in str(e["data"].get("reason"))
                   for e in events), events
        assert not [g for n in c.get("/v1/nodes").json()["data"] for g in n["gpus"]
                    if g["job_id"] == jid]
        with lone.engine().connect() as db:
            open_leases = db.execute(text("SELECT count(*) FROM gpu_leases WHERE job_id = :j "
                                          "AND end_at IS NULL"), {"j": jid}).scalar()
        assert open_leases == 0


# ---- 6: priority bands ---------------------------------------------------------------------

def test_a_member_orders_their_own_jobs_within_their_band(api, member):
    me = member.get("/v1/users/me").json()
    assert me["max_priority"] == 50
    made = []
    for p in (0, 10, 50):  # their own order, up to the default
        r = member.post("/v1/jobs", {"type": "probe", "priority": p,
                                     "params": {"import_torch": False}})
        assert r.status_code == 201, r.text
        made.append(r.json()["id"])
    # above it: a priority that would preempt others' default-priority work
    for p in (51, 80):
        e = _err(member.post("/v1/jobs", {"type": "probe", "priority": p}), 403,
                 "priority_above_band")
        assert e["param"] == "priority" and "0-50" in e["message"], e
        assert "granted per user by an admin" in e["message"], e
        assert e["details"] == {"priority": p, "max_priority": 50}
    # a member cannot grant themselves more
    e = _err(member.c.patch(f"/v1/users/{me['id']}", json={"max_priority": 100}), 403)
    # an admin grants a band, and withdraws it
    r = api.c.patch(f"/v1/users/{me['id']}", json={"max_priority": 70})
    assert r.status_code == 200 and r.json()["max_priority"] == 70, r.text
    r = member.post("/v1/jobs", {"type": "probe", "priority": 70,
                                 "params": {"import_torch": False}})
    assert r.status_code == 201, r.text
    made.append(r.json()["id"])
    e = _err(member.post("/v1/jobs", {"type": "probe", "priority": 71}), 403,
             "priority_above_band")
    assert "0-70" in e["message"], e
    assert api.c.patch(f"/v1/users/{me['id']}", json={"max_priority": None}).json()[
        "max_priority"] == 50
    _err(member.post("/v1/jobs", {"type": "probe", "priority": 70}), 403, "priority_above_band")
    _err(api.c.patch(f"/v1/users/{me['id']}", json={"max_priority": 101}), 422)
    _err(api.c.patch("/v1/users/usr_nobody", json={"max_priority": 60}), 404)
    for jid in made:
        member.post(f"/v1/jobs/{jid}/cancel")
    # admins keep the whole range
    job = api.submit(type="probe", priority=100, params={"import_torch": False})
    api.post(f"/v1/jobs/{job['id']}/cancel")
