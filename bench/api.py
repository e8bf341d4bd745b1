"""GET /v1/jobs/{id} throughput and latency with 10,000 jobs in the DB, against a bare FastAPI
route answering constant JSON, served the same way (uvicorn, one process) in the same run.

    python bench/api.py [--quick] [--seconds 5] [--rounds 3] [--concurrency 16]
Target: requests/s of the real route at least 0.8 of the bare route (the median of
alternating rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._common import emit, result, scratch_database
from procgroup import free_port

BARE = '''
from fastapi import FastAPI
from fastapi.responses import ORJSONResponse
app = FastAPI(default_response_class=ORJSONResponse)
BODY = {"id": "job_x", "type": "probe", "status": "succeeded", "progress": None, "outputs": []}
@app.get("/v1/jobs/{job_id}")
def get(job_id: str):
    return BODY
'''


def serve(argv: list[str], env: dict, port: int) -> subprocess.Popen:
    p = subprocess.Popen(argv + ["--host", "127.0.0.1", "--port", str(port), "--log-level",
                                 "warning", "--no-access-log"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return p
        except httpx.HTTPError:
            time.sleep(0.1)
    return p


async def load(url: str, paths: list[str], headers: dict, seconds: float, conc: int):
    lat: list[float] = []
    stop = time.perf_counter() + seconds
    async with httpx.AsyncClient(base_url=url, headers=headers,
                                 limits=httpx.Limits(max_connections=conc)) as c:
        async def one():
            while time.perf_counter() < stop:
                t = time.perf_counter()
                r = await c.get(random.choice(paths))
                assert r.status_code == 200, r.text
                lat.append(time.perf_counter() - t)
        t0 = time.perf_counter()
        await asyncio.gather(*[one() for _ in range(conc)])
        el = time.perf_counter() - t0
    lat.sort()
    return len(lat) / el, lat[len(lat) // 2] * 1000, lat[int(len(lat) * 0.99)] * 1000


def seed(url: str, home: Path, n: int) -> tuple[list[str], str]:
    os.environ.update({"DRAFTYARD_DATABASE_URL": url, "DRAFTYARD_HOME": str(home)})
    from app.core.db import unit_of_work, utcnow
    from app.core.ids import new_id
    from app.core.migrate import upgrade_head
    from app.models import Job
    from app.users.service import ensure_admin

    upgrade_head(url)
    with unit_of_work() as s:
        token = ensure_admin(s, home)
        from app.models import User
        from sqlalchemy import select

        uid = s.scalar(select(User.id))
    ids = []
    with unit_of_work() as s:
        now = utcnow()
        rows = []
        for i in range(n):
            jid = new_id("job")
            ids.append(jid)
            rows.append(dict(id=jid, type="probe", owner_id=uid, status="succeeded", priority=50,
                             gpus_requested=0, inputs={}, params={"steps": 1}, depends_on=[],
                             outputs=[], metrics_summary={"python": "3.11"}, created_at=now,
                             progress={"stage": "probe", "done": 1, "total": 1, "unit": "steps"}))
        s.execute(Job.__table__.insert(), rows)
    return ids, token


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--jobs", type=int, default=10_000)
    a = ap.parse_args()
    secs, rounds = (2, 3) if a.quick else (a.seconds, a.rounds)
    with scratch_database() as url, tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        ids, token = seed(url, home, a.jobs)
        env = {**os.environ, "DRAFTYARD_DATABASE_URL": url, "DRAFTYARD_HOME": str(home),
               "DRAFTYARD_BROKER_URL": "redis://127.0.0.1:6379/15"}
        (home / "bare.py").write_text(BARE)
        routes = (
            ("bare route", [sys.executable, "-m", "uvicorn", "bare:app", "--app-dir", tmp],
             {}, ["/v1/jobs/job_x"]),
            ("GET /v1/jobs/{id}", [sys.executable, "-m", "uvicorn", "app.main:create_app",
                                   "--factory"], {"Authorization": f"Bearer {token}"},
             [f"/v1/jobs/{i}" for i in ids]),
        )
        # Both servers up at once, measured in alternating rounds (bare first, then real
        # first, ...): on a shared box the load moves between rounds, and a ratio of two
        # measures taken seconds apart is what it can hold still.
        procs, urls = [], []
        try:
            for _name, argv, _h, _paths in routes:
                port = free_port()
                procs.append(serve(argv, env, port))
                urls.append(f"http://127.0.0.1:{port}")
            for (_n, _a, headers, paths), url_ in zip(routes, urls, strict=True):
                asyncio.run(load(url_, paths, headers, 1.0, a.concurrency))  # warm-up
            per: list[list[tuple[float, float, float]]] = [[], []]
            for r in range(rounds):
                for k in ((0, 1) if r % 2 == 0 else (1, 0)):
                    _n, _a, headers, paths = routes[k]
                    per[k].append(asyncio.run(load(urls[k], paths, headers, secs,
                                                   a.concurrency)))
        finally:
            for p in procs:
                p.terminate()
                p.wait(10)
    ratios = [real[0] / bare[0] for bare, real in zip(per[0], per[1], strict=True)]
    print(f"{'route':<22}{'round':>6}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}   "
          f"({a.jobs} jobs in the DB, {secs:g} s per measure)")
    for (name, *_), rows in zip(routes, per, strict=True):
        for r, (rps, p50, p99) in enumerate(rows, 1):
            print(f"{name:<22}{r:>6}{rps:>10.0f}{p50:>10.2f}{p99:>10.2f}")
    print("ratio per round: " + ", ".join(f"{x:.3f}" for x in ratios)
          + f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    # The round with the median ratio: its two measures, side by side in time.
    mid = sorted(range(rounds), key=lambda i: ratios[i])[rounds // 2]
    emit(result("api", "get_job_rps_vs_bare", per[1][mid][0], per[0][mid][0], 0.8))


if __name__ == "__main__":
    main()
