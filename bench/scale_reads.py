"""Reads at the seeds' scale: the API's answers with a big database.

    python bench/scale_reads.py            # 10,000 jobs, 100,000 events on one job, 5,000 rejects
    python bench/scale_reads.py --quick    # 2,000 jobs, 20,000 events, 2,000 rejects

A throwaway deployment (tests/service/stack.py: its own PostgreSQL database, Redis DB 15, one
API process; no worker, nothing runs). The rows are inserted directly, as bench/scheduler.py
does: an 800,000-record dataset whose ingest artifact holds `--rejects` rejects (a real
`rejects.jsonl` of that many lines under the artifact's folder), `--jobs` jobs from 21 users
in every status, and one finished prepare job with `--events` events (progress, metrics,
warnings, its status changes). ANALYZE runs after the fill, as autovacuum would.

Measured (`--repeats` requests each, after 3 warm-up ones; wall time of the HTTP round trip
from this process, so it includes the client): GET /v1/datasets/{id}; its rejects, the first
page and one deep in the file (the cursor of the last page); GET /v1/jobs/{id} of the job
with the events; its events, the first page (1000) and a page after the 90,000th event;
GET /v1/jobs (newest 20), with a status filter and as a member (owner filter). Target: p50 <=
100 ms each. Baseline: GET /readyz (the API's floor for a request on this machine).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._common import REDIS_DB  # noqa: E402

from tests.service.stack import Stack  # noqa: E402

STATUSES = ["succeeded"] * 6 + ["failed", "cancelled", "queued", "pending", "running"]
TYPES = ["ingest", "mix", "prepare", "generate", "extract", "train", "evaluate", "probe"]


def fill(stack: Stack, n_jobs: int, n_events: int, n_rejects: int) -> dict:
    from sqlalchemy import insert, text
    from sqlalchemy.orm import Session

    from app.core.db import utcnow
    from app.models import Artifact, Dataset, Job, JobEvent, User

    rng = random.Random(22)
    now = utcnow()
    admin = None
    with Session(stack.engine()) as s:
        admin = s.scalar(text("SELECT id FROM users WHERE role = 'admin' LIMIT 1"))
        uids = [f"usr_read{i:03d}" for i in range(20)]
        s.execute(insert(User), [{"id": u, "name": u, "role": "member"} for u in uids])
        owners = uids + [admin]
        art_dir = stack.home / "artifacts" / "art_reads"
        art_dir.mkdir(parents=True)
        with open(art_dir / "rejects.jsonl", "w") as f:
            for i in range(n_rejects):
                f.write(json.dumps({"line": 100 + i * 160, "reason": "invalid JSON: unexpected "
                                    f"end of data: line 1 column {rng.randint(5, 900)}"}) + "\n")
        s.add(Artifact(id="art_reads", kind="dataset", uri=str(art_dir), bytes=1 << 30,
                       files=[{"path": "rejects.jsonl", "bytes": 1}], owner_id=admin,
                       meta={"num_records": 800_000}))
        s.add(Dataset(id="ds_reads", name="seeds-800k", owner_id=admin, status="ready",
                      format="openorca", num_records=800_000, num_rejected=n_rejects,
                      rejected_sample=[{"line": 100 + i * 160, "reason": "invalid JSON"}
                                       for i in range(20)],
                      stats={"records": 800_000, "turns": 1_600_000}, artifact_id="art_reads",
                      job_id="job_reads_events"))
        rows = []
        for i in range(n_jobs):
            st = rng.choice(STATUSES)
            t = now - timedelta(minutes=n_jobs - i)
            rows.append({"id": f"job_r{i:07d}", "type": rng.choice(TYPES),
                         "owner_id": rng.choice(owners), "status": st, "priority": 50,
                         "gpus_requested": rng.choice([0, 0, 1, 8]), "created_at": t,
                         "queued_at": t, "inputs": {"dataset": "ds_reads"},
                         "params": {"seq_length": 4096},
                         "progress": {"stage": "x", "done": 5, "total": 10, "unit": "records"},
                         "started_at": t if st not in ("queued", "pending") else None,
                         "finished_at": t if st in ("succeeded", "failed", "cancelled") else None})
        rows.append({"id": "job_reads_events", "type": "prepare", "owner_id": admin,
                     "status": "succeeded", "priority": 50, "gpus_requested": 0,
                     "created_at": now, "queued_at": now, "started_at": now, "finished_at": now})
        for i in range(0, len(rows), 2000):
            s.execute(insert(Job), rows[i:i + 2000])
        evs = []
        for i in range(n_events):
            k = i % 10
            kind = "progress" if k < 6 else ("metric" if k < 9 else "warning")
            data = ({"stage": "prepare", "done": i, "total": n_events, "unit": "records",
                     "rate": 300.0, "eta_s": (n_events - i) / 300} if kind == "progress" else
                    {"step": i, "loss": rng.random()} if kind == "metric" else
                    {"message": f"record r{i} truncated to 4096 tokens"})
            evs.append({"job_id": "job_reads_events", "kind": kind, "data": data,
                        "at": now - timedelta(seconds=n_events - i)})
            if len(evs) == 5000:
                s.execute(insert(JobEvent), evs)
                evs = []
        if evs:
            s.execute(insert(JobEvent), evs)
        s.commit()
    with stack.engine().connect() as c:
        c.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE")
    return {"member": uids[0]}


def timed(client, path: str, repeats: int, **params) -> list[float]:
    out = []
    for i in range(repeats + 3):
        t0 = time.perf_counter()
        r = client.get(path, params=params)
        dt = time.perf_counter() - t0
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
        if i >= 3:
            out.append(dt * 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--events", type=int, default=None)
    ap.add_argument("--rejects", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args()
    n_jobs = a.jobs or (2000 if a.quick else 10_000)
    n_events = a.events or (20_000 if a.quick else 100_000)
    n_rejects = a.rejects or (2000 if a.quick else 5000)
    stack = Stack("reads", REDIS_DB)
    results = {}
    try:
        stack.create()
        t0 = time.perf_counter()
        who = fill(stack, n_jobs, n_events, n_rejects)
        fill_s = time.perf_counter() - t0
        stack.start_api()
        with stack.client() as c:
            pages, after, deep = 0, None, None
            while True:  # the deep cursor: page through once, keep the last page's
                body = c.get("/v1/datasets/ds_reads/rejects",
                             params={"limit": 1000, **({"after": after} if after else {})}).json()
                pages += 1
                if not body["has_more"]:
                    break
                deep, after = after, body["next_after"]
            ev_seq = c.get("/v1/jobs/job_reads_events/events",
                           params={"limit": 1, "after_seq": 0}).json()["data"][0]["seq"]
            cases = [
                ("GET /readyz (baseline)", "/readyz", {}),
                ("GET /v1/datasets/{id}", "/v1/datasets/ds_reads", {}),
                ("GET .../rejects (first 100)", "/v1/datasets/ds_reads/rejects", {}),
                ("GET .../rejects (deep, 1000)", "/v1/datasets/ds_reads/rejects",
                 {"limit": 1000, "after": deep or "0"}),
                ("GET /v1/jobs/{id} (100K events)", "/v1/jobs/job_reads_events", {}),
                ("GET .../events (first 1000)", "/v1/jobs/job_reads_events/events", {}),
                ("GET .../events (after 90%)", "/v1/jobs/job_reads_events/events",
                 {"after_seq": ev_seq + int(n_events * 0.9)}),
                ("GET /v1/jobs (newest 20)", "/v1/jobs", {}),
                ("GET /v1/jobs?status=succeeded", "/v1/jobs", {"status": "succeeded"}),
                ("GET /v1/jobs?owner=<member>", "/v1/jobs", {"owner": who["member"]}),
            ]
            for name, path, params in cases:
                results[name] = timed(c, path, a.repeats, **params)
    finally:
        stack.close()

    base = statistics.median(results.pop("GET /readyz (baseline)"))
    print(f"filled {n_jobs:,} jobs, {n_events:,} events on one job, {n_rejects:,} rejects in "
          f"{fill_s:.1f} s; baseline GET /readyz p50 {base:.1f} ms")
    print(f"{'request':<36}{'p50 ms':>9}{'p95 ms':>9}{'target':>8}")
    out = []
    for name, xs in results.items():
        p50 = statistics.median(xs)
        p95 = sorted(xs)[int(0.95 * (len(xs) - 1))]
        print(f"{name:<36}{p50:>9.1f}{p95:>9.1f}{'<=100':>8}")
        out.append({"bench": "scale_reads", "metric": name, "value": round(p50, 1),
                    "baseline": round(base, 1), "ratio": round(p50 / base, 2), "target": 100,
                    "pass": p50 <= 100, "p95_ms": round(p95, 1)})
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
