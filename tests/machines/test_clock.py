"""The database's clock decides leases and fencing. Two workers, `a` (the node that
reaps: first by name) with its clock two minutes off and `b` with the right one, each with one
GPU; a long GPU probe runs on each. Without one clock, `a` ahead reaps `b`'s job as two
minutes stale while it runs (and it runs again), and `a` behind looks dead to everyone (its job
is reaped under it). With it: both jobs end once on their first attempt, never two stage
processes of one job, both nodes stay schedulable, no GPU lease leaked or overlapping (lease
times from two clocks would overlap)."""

from __future__ import annotations

import threading
import time

import pytest

from tests.conftest import REDIS_DBS
from tests.faults.harness import FaultStack, StageSampler, lease_problems
from tests.machines.clock import skewed_env
from tests.service.stack import Stack

TERMINAL = ("succeeded", "failed", "cancelled")
_wait = FaultStack.wait


def _run(offset_s: float, how: str) -> None:
    st = Stack("clock", REDIS_DBS[1]).create()
    sampler = None
    try:
        st.start_api()
        st.start_worker("a", "0", env=skewed_env(offset_s, how))
        st.start_worker("b", "0")
        st.wait_nodes(["a", "b"])
        sampler = StageSampler(st.home).start()
        with st.client() as c:
            ids = [c.post("/v1/jobs", json={"type": "probe", "gpus": 1, "params": {
                "sleep_s": 8, "steps": 4, "import_torch": False}}).json()["id"]
                for _ in range(2)]
            _wait(lambda: {c.get(f"/v1/jobs/{j}").json()["node"] for j in ids} == {"a", "b"},
                  60, "one probe running on each node")
            seen_dead: set[str] = set()
            stop = threading.Event()

            def watch_nodes():
                with st.client() as c2:
                    while not stop.is_set():
                        for n in c2.get("/v1/nodes").json()["data"]:
                            if not n["schedulable"]:
                                seen_dead.add(n["name"])
                        stop.wait(0.5)

            t = threading.Thread(target=watch_nodes, daemon=True)
            t.start()
            jobs = _wait(lambda: all((js := [c.get(f"/v1/jobs/{j}").json() for j in ids]))
                         and all(j["status"] in TERMINAL for j in js) and js, 120,
                         "both probes to end")
            stop.set()
            t.join(5)
            time.sleep(0.3)
            ends = {j: [e["data"]["to"] for e in c.get(f"/v1/jobs/{j}/events").json()["data"]
                        if e["kind"] == "status" and e["data"].get("to") in TERMINAL]
                    for j in ids}
        detail = [(j["id"], j["node"], j["status"], j["attempt"], j.get("error")) for j in jobs]
        assert all(j["status"] == "succeeded" and j["attempt"] == 1 for j in jobs), detail
        assert all(e == ["succeeded"] for e in ends.values()), ends
        assert max(sampler.max_per_job.values(), default=0) == 1, sampler.doubles
        assert set(sampler.max_per_job) == set(ids), sampler.max_per_job
        assert not seen_dead, f"nodes seen unschedulable while heartbeating: {seen_dead}"
        assert not lease_problems(st.engine()), lease_problems(st.engine())
    finally:
        if sampler:
            sampler.stop()
        st.close()


def test_worker_clock_ahead_two_minutes():
    _run(120, "libc")


@pytest.mark.slow
@pytest.mark.parametrize("offset_s,how", [(-120, "libc"), (120, "env"), (-120, "env")])
def test_worker_clock_off_slow(offset_s, how):
    _run(offset_s, how)
