"""Two API replicas (two processes, two ports) on one database, as behind a load
balancer. Every webhook event is delivered once though both run the outbox sender (rows are
claimed FOR UPDATE SKIP LOCKED with a lease: app/webhooks/sender.py); one Idempotency-Key sent
to both replicas at once makes one job; an SSE stream follows a job accepted by the other
replica, and a stream cut by killing its replica resumes on the other with Last-Event-ID
without losing or repeating an event; killing a replica loses no job and no delivery.
Deliveries per event go to DRAFTYARD_MACHINES_TABLE (JSON lines) and stdout."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter

import httpx
import pytest

from tests.conftest import REDIS_DBS
from tests.faults.harness import FaultStack
from tests.machines.test_partition import record
from tests.service.receiver import Receiver
from tests.service.stack import Stack

TERMINAL = ("succeeded", "failed", "cancelled")
_wait = FaultStack.wait
PROBE = {"type": "probe", "gpus": 0, "params": {"sleep_s": 0, "steps": 1,
                                                "import_torch": False}}


def _sse(c: httpx.Client, job: str, last: str | None, out: list[dict], stop_after: int = 0):
    """Read the job's event stream into `out` until it ends (or `stop_after` events)."""
    headers = {"Accept": "text/event-stream", **({"Last-Event-ID": last} if last else {})}
    with c.stream("GET", f"/v1/jobs/{job}/events", headers=headers, timeout=60) as r:
        assert r.status_code == 200, r.read()
        n = 0
        for line in r.iter_lines():
            if line.startswith("data:"):
                out.append(json.loads(line[5:]))
                n += 1
                if stop_after and n >= stop_after:
                    return


@pytest.mark.slow
def test_two_api_replicas():
    st = Stack("replicas", REDIS_DBS[1], {"DRAFTYARD_WEBHOOK_POLL_S": "0.1",
                                          "DRAFTYARD_CPU_SLOTS": "4"}).create()
    try:
        urls = [st.start_api(), st.start_api()]
        replicas = list(st.procs)
        st.start_worker("rep")
        st.wait_nodes(["rep"])
        auth = {"Authorization": f"Bearer {st.token}"}
        c0, c1 = (httpx.Client(base_url=u, timeout=30, headers=auth) for u in urls)
        with Receiver() as rx, c0, c1:
            r = c0.post("/v1/webhooks", json={"url": rx.url, "events": ["job.succeeded"]})
            assert r.status_code == 201, r.text
            # One key, both replicas at once: one job, the other answer a replay of it.
            same: list[httpx.Response] = []
            for k in range(4):
                key = f"k-{k}-{time.time()}"
                go = threading.Barrier(2)

                def post(c, key=key, go=go):
                    go.wait()
                    same.append(c.post("/v1/jobs", json=PROBE,
                                       headers={"Idempotency-Key": key}))
                ts = [threading.Thread(target=post, args=(c,)) for c in (c0, c1)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
            pairs = [same[i:i + 2] for i in range(0, len(same), 2)]
            assert all(a.status_code == b.status_code == 201 and a.json()["id"] == b.json()["id"]
                       for a, b in pairs), [(x.status_code, x.text[:200]) for x in same]
            assert all(sum(x.headers.get("Idempotent-Replayed") == "true" for x in p) == 1
                       for p in pairs), [dict(x.headers) for x in same]
            jobs = [p[0].json()["id"] for p in pairs]
            # A long job accepted by replica 0, followed on replica 0 until it is killed,
            # then on replica 1 from the last event id.
            long = c0.post("/v1/jobs", json={**PROBE, "params": {
                "sleep_s": 8, "steps": 8, "import_torch": False}}).json()["id"]
            jobs.append(long)
            seen: list[dict] = []
            _sse(c0, long, None, seen, stop_after=3)
            jobs += [c.post("/v1/jobs", json=PROBE).json()["id"] for c in (c0, c1) * 5]
            replicas[0].kill(signal.SIGKILL)  # replica 0 dies; its stream is cut
            t_kill = time.monotonic()
            jobs += [c1.post("/v1/jobs", json=PROBE).json()["id"] for _ in range(10)]
            _sse(c1, long, str(seen[-1]["seq"]), seen)
            done = _wait(lambda: all((x := [c1.get(f"/v1/jobs/{j}").json() for j in jobs]))
                         and all(j["status"] in TERMINAL for j in x) and x, 120, "all jobs")
            assert all(j["status"] == "succeeded" for j in done), done
            _wait(lambda: {json.loads(q["body"])["data"]["job"]["id"]
                           for q in rx.snapshot()} >= set(jobs), 60, "every delivery")
            time.sleep(2)  # a second delivery of any event would have arrived by now
            per_event = Counter(q["headers"]["X-Draftyard-Event-Id"] for q in rx.snapshot())
            per_job = Counter(json.loads(q["body"])["data"]["job"]["id"]
                              for q in rx.snapshot())
            every = c1.get(f"/v1/jobs/{long}/events").json()["data"]
        assert [e["seq"] for e in seen] == [e["seq"] for e in every], (seen, every)
        assert set(per_job) == set(jobs)
        assert set(per_event.values()) == {1}, per_event
        record({"test": "api_replicas", "replicas": 2, "jobs": len(jobs),
                "events": len(per_event), "deliveries": sum(per_event.values()),
                "deliveries_per_event": dict(Counter(per_event.values())),
                "idempotent_pairs_one_job": len(pairs),
                "sse_events_across_kill": len(seen),
                "after_kill_s": round(time.monotonic() - t_kill, 1)})
    finally:
        st.close()
