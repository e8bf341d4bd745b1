"""A draftyard deployment that faults can hit: its own PostgreSQL and Redis servers
(tests/services.py, on free ports, never the ones other tests use), an API process and a worker
declaring `--gpus 0,1`; a sampler of the process table; the checks every fault test makes.

What the deployment promises under faults (docs/API-additions.md, "Never twice: faults and
recovery"), as checked here after each fault:
- every job ends exactly once (one terminal status event, and it is `succeeded`);
- never two stage processes for one job at any moment (the sampler reads /proc every 50 ms:
  processes running `workers.stages` with this deployment's DRAFTYARD_HOME, per DRAFTYARD_JOB_ID,
  not counting a stage's own children);
- no GPU lease leaked (every lease closed, none overlapping on a GPU, no GPU held);
- recovery within 60 s of the fault ending (a canary probe submitted then has succeeded);
- while the DB is down, the API answers 503 with the error object.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx

from tests.service.stack import Stack
from tests.services import LocalPostgres, LocalRedis

TERMINAL = ("succeeded", "failed", "cancelled")
NODE = "f1"
RESULTS = os.environ.get("DRAFTYARD_FAULT_TABLE")  # append one JSON row per fault here


class StageSampler:
    """Max number of live stage processes per job, sampled from the process table."""

    def __init__(self, home: Path, every_s: float = 0.05):
        self.home = str(home)
        self.every_s = every_s
        self.max_per_job: Counter = Counter()
        self.samples = 0
        self.doubles: list[str] = []  # what the process table showed when a job had two
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name="stage-sampler")

    def start(self) -> "StageSampler":
        self._t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._t.join(5)

    def snapshot(self) -> dict[str, list[int]]:
        """Per job, its stage *attempts* now: live stage processes whose parent is not a stage
        process of the same job (a stage's own children, e.g. a fork that has not exec'd
        yet and so shows the same command line, belong to its attempt)."""
        procs: dict[str, dict[int, int]] = defaultdict(dict)  # job -> pid -> ppid
        # os.listdir and open(), not Path: this runs 20 times a second through a whole fault
        # test, and pathlib's objects made it 1.4 ms of CPU a scan of 100 processes.
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if b"workers.stages" not in f.read():
                        continue
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read().rsplit(")", 1)[1].split()
                if stat[0] == "Z":
                    continue  # exited, not yet reaped: it runs nothing
                with open(f"/proc/{name}/environ", "rb") as f:
                    env = dict(kv.split("=", 1) for kv in
                               f.read().decode(errors="replace").split("\0") if "=" in kv)
            except (OSError, IndexError):
                continue
            if env.get("DRAFTYARD_HOME") == self.home and env.get("DRAFTYARD_JOB_ID"):
                procs[env["DRAFTYARD_JOB_ID"]][int(name)] = int(stat[1])
        return {job: [p for p, pp in ps.items() if pp not in ps] for job, ps in procs.items()}

    def _run(self) -> None:
        while not self._stop.is_set():
            for job, pids in self.snapshot().items():
                self.max_per_job[job] = max(self.max_per_job[job], len(pids))
                if len(pids) > 1 and len(self.doubles) < 5:
                    self.doubles.append(f"{job}: " + "; ".join(_describe(p) for p in pids))
            self.samples += 1
            self._stop.wait(self.every_s)


def _describe(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
        return f"pid {pid} state {stat[0]} ppid {stat[1]} pgid {stat[2]} {cmd}"
    except OSError as e:
        return f"pid {pid} gone ({e})"


class FaultStack:
    """PostgreSQL + Redis of its own, an API and worker `f1 --gpus 0,1` against them."""

    def __init__(self, stale_s: float, heartbeat_s: float = 0.5, home: Path | None = None,
                 settings: dict[str, str] | None = None):
        self.root = Path(tempfile.mkdtemp(prefix="draftyard-faults-"))
        self.home = home
        self.pg = LocalPostgres(self.root / "pg")
        self.redis = LocalRedis(self.root / "redis")
        self.settings = {"DRAFTYARD_STALE_AFTER_S": str(stale_s),
                         "DRAFTYARD_HEARTBEAT_S": str(heartbeat_s),
                         "DRAFTYARD_CANCEL_GRACE_S": "2", **(settings or {})}
        self.stack: Stack | None = None
        self.worker = None
        self.sampler: StageSampler | None = None
        self.jobs: list[str] = []  # every job the API took (all must end once)
        self.long_jobs: list[str] = []  # the ones running through the fault

    # -- lifecycle ------------------------------------------------------------------------
    def up(self) -> "FaultStack":
        self.pg.start()
        self.redis.start()
        self.stack = Stack("faults", 1, self.settings, pg_admin=f"{self.pg.url}/test",
                           redis_base=self.redis.url, home=self.home).create()
        self.stack.start_api()
        self.start_worker()
        self.sampler = StageSampler(self.stack.home).start()
        return self

    def start_worker(self):
        self.worker = self.stack.start_worker(NODE, "0,1")
        # Registered by this process. Not "both GPUs free": a restarted node's requeued jobs
        # may take them again at once, before a poll could see them free.
        self.wait(lambda: any(n["name"] == NODE and n["schedulable"]
                              and n["info"].get("pid") == self.worker.pid
                              for n in self.get("/v1/nodes").json()["data"]),
                  60, f"worker {NODE} to register")
        return self.worker

    def restart_api(self) -> None:
        self.stack.start_api()

    def close(self) -> None:
        if self.sampler:
            self.sampler.stop()
        if self.stack is not None:
            for p in reversed(self.stack.procs):
                p.kill(signal.SIGKILL)
            self.stack.procs.clear()
        self.pg.stop()
        self.redis.stop()
        if self.stack is not None:
            shutil.rmtree(self.stack.home, ignore_errors=True)
        shutil.rmtree(self.root, ignore_errors=True)

    # -- HTTP -----------------------------------------------------------------------------
    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.stack.url, timeout=30,
                            headers={"Authorization": f"Bearer {self.stack.token}"})

    def get(self, path: str) -> httpx.Response:
        with self.client() as c:
            return c.get(path)

    def submit(self, gpus: int, sleep_s: float, c: httpx.Client | None = None) -> httpx.Response:
        body = {"type": "probe", "gpus": gpus,
                "params": {"sleep_s": sleep_s, "steps": 4, "import_torch": False}}
        if c is None:
            with self.client() as c2:
                r = c2.post("/v1/jobs", json=body)
        else:
            r = c.post("/v1/jobs", json=body)
        if r.status_code == 201:
            self.jobs.append(r.json()["id"])
        return r

    def job(self, job_id: str) -> dict:
        r = self.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()

    @staticmethod
    def wait(pred, timeout: float, what: str, every: float = 0.2):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = pred()
            except httpx.HTTPError as e:
                last = e
            if last and not isinstance(last, Exception):
                return last
            time.sleep(every)
        raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")

    def start_long(self, gpu_jobs: int, cpu_jobs: int, sleep_s: float) -> list[str]:
        """Probes that will be running when the fault hits: GPU ones (one GPU each) and CPU
        ones; returns their ids once all run."""
        ids = [self.submit(1, sleep_s).json()["id"] for _ in range(gpu_jobs)]
        ids += [self.submit(0, sleep_s).json()["id"] for _ in range(cpu_jobs)]
        self.long_jobs += ids
        self.wait_running(ids)
        return ids

    def wait_running(self, ids: list[str], timeout: float = 60) -> None:
        self.wait(lambda: all(self.job(j)["status"] == "running" for j in ids), timeout,
                  f"{ids} to run")

    # -- during a fault -------------------------------------------------------------------
    def load_while(self, stop: threading.Event, gpus_cycle=(1, 0)) -> dict:
        """Submit probes and read jobs every 0.5 s until `stop`; returns what was seen:
        HTTP status counts and the 503 bodies' error codes."""
        seen: Counter = Counter()
        codes: Counter = Counter()
        bad: list[str] = []
        i = 0
        with self.client() as c:
            while not stop.is_set():
                for r in self._try(lambda i=i: self.submit(gpus_cycle[i % len(gpus_cycle)], 0.5, c)), \
                        self._try(lambda: c.get("/v1/jobs", params={"limit": 5})):
                    if r is None:
                        seen["conn_error"] += 1
                        continue
                    seen[r.status_code] += 1
                    if r.status_code >= 500:
                        try:
                            err = r.json()["error"]
                            codes[err["code"]] += 1
                            assert err["message"]
                        except (ValueError, KeyError, TypeError, AssertionError):
                            bad.append(f"{r.status_code} {r.text[:200]}")
                i += 1
                stop.wait(0.5)
        return {"http": dict(seen), "error_codes": dict(codes), "bad_bodies": bad}

    @staticmethod
    def _try(fn):
        try:
            return fn()
        except httpx.HTTPError:
            return None

    def canary(self, t_end: float, timeout: float = 60) -> float:
        """Seconds from the fault's end (monotonic t_end) until a probe submitted now (retried
        until the API takes it) has succeeded."""
        r = self.wait(lambda: (x := self.submit(0, 0.0)).status_code == 201 and x, timeout,
                      "the API to take a canary job")
        jid = r.json()["id"]
        self.wait(lambda: self.job(jid)["status"] in TERMINAL, timeout, "the canary to end")
        assert self.job(jid)["status"] == "succeeded", self.job(jid)
        return time.monotonic() - t_end

    # -- the checks -----------------------------------------------------------------------
    def check(self, fault: str, *, recovery_s: float, http_down: dict | None = None,
              timeout: float = 120, retried: tuple[str, ...] = ()) -> dict:
        """Wait for every job to end, then check the promises; return the table row.
        `retried`: jobs that failed once by design and were retried by the test."""
        self.wait(lambda: all(self.job(j)["status"] in TERMINAL for j in self.jobs), timeout,
                  "every job to end")
        time.sleep(0.3)  # a last sample after the last stage exits
        ends, attempts = {}, {}
        for j in self.jobs:
            evs = self.get(f"/v1/jobs/{j}/events").json()["data"]
            ends[j] = [e["data"]["to"] for e in evs
                       if e["kind"] == "status" and e["data"].get("to") in TERMINAL]
            attempts[j] = self.job(j)["attempt"]
        not_once = {j: e for j, e in ends.items()
                    if e != (["failed", "succeeded"] if j in retried else ["succeeded"])}
        assert not not_once, (
            f"{fault}: jobs that did not end exactly once, succeeded: {not_once}; "
            f"their errors: {[self.job(j).get('error') for j in not_once]}")
        per_job = dict(self.sampler.max_per_job)
        assert max(per_job.values(), default=0) <= 1, \
            f"two stage processes for one job: {self.sampler.doubles}"
        # The sampler must have seen the long jobs, or its maximum proves nothing.
        assert set(self.long_jobs) <= set(per_job), \
            f"long jobs never sampled running: {set(self.long_jobs) - set(per_job)}"
        leaks = self._lease_problems()
        assert not leaks, leaks
        assert recovery_s < 60, f"recovery took {recovery_s:.1f}s"
        row = {"fault": fault, "jobs": len(self.jobs),
               "ended_once": len(self.jobs) - len(not_once),
               "max_stage_procs_per_job": max(per_job.values(), default=0),
               "attempts_gt_1": sum(1 for a in attempts.values() if a > 1),
               "recovery_s": round(recovery_s, 1), "samples": self.sampler.samples,
               "http_while_down": (http_down or {}).get("http")}
        print("FAULT-ROW", json.dumps(row))
        if RESULTS:
            with open(RESULTS, "a") as fh:
                fh.write(json.dumps(row) + "\n")
        return row

    def reasons(self, job_ids: list[str] | None = None) -> Counter:
        """Reasons of the status events of these jobs (all by default)."""
        out: Counter = Counter()
        for j in job_ids or self.jobs:
            for e in self.get(f"/v1/jobs/{j}/events").json()["data"]:
                if e["kind"] == "status" and e["data"].get("reason"):
                    out[e["data"]["reason"]] += 1
        return out

    def _lease_problems(self) -> list[str]:
        return lease_problems(self.stack.engine())


def lease_problems(engine) -> list[str]:
    """GPU leases still held, never closed, or overlapping on one GPU."""
    from sqlalchemy import text

    problems = []
    with engine.connect() as c:
        held = c.execute(text("SELECT node, index, job_id FROM gpus "
                              "WHERE job_id IS NOT NULL")).all()
        problems += [f"GPU {r.node}/{r.index} still held by {r.job_id}" for r in held]
        rows = c.execute(text("SELECT job_id, node, index, start_at, end_at FROM gpu_leases "
                              "ORDER BY node, index, start_at")).all()
    last: dict = {}
    for r in rows:
        if r.end_at is None:
            problems.append(f"lease of {r.job_id} on {r.node}/{r.index} never closed")
            continue
        prev = last.get((r.node, r.index))
        if prev is not None and prev.end_at > r.start_at:
            problems.append(f"GPU {r.node}/{r.index}: {prev.job_id} and {r.job_id} overlap")
        last[(r.node, r.index)] = r
    return problems
