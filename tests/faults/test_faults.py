"""The fault suite (docs/API-additions.md, "Never twice: faults and recovery"): PostgreSQL
down, Redis down, the API SIGKILLed, the worker's
process group SIGKILLed and restarted under the same node name, while GPU probes (worker
declared `--gpus 0,1`) and CPU probes run and more are submitted. Each fault is followed by
the checks of tests/faults/harness.py (ends once, never two stage processes for one job, no
lease leaked, recovery < 60 s, 503 with the error object while the DB is down).

The default suite runs every fault briefly (4 s) on one deployment with stale_after_s=10 (a
supervisor then rides out 15 s: PostgreSQL's own stop and start add seconds to a 4-s outage
on a loaded machine, and CI once saw a job give up at 9 s); the `slow` variants hold each
fault 20 s with the production setting stale_after_s=20 (it rides out 30 s), each on a fresh
deployment. A full disk: test_disk_full.py. DRAFTYARD_FAULT_TABLE=file.jsonl collects one row per fault.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.faults.harness import NODE, FaultStack
from procgroup import PARENT_ENV


def _during(fs: FaultStack, down_s: float) -> dict:
    """Load the API for down_s (submits and reads); returns what it answered."""
    stop, out = threading.Event(), {}
    t = threading.Thread(target=lambda: out.update(fs.load_while(stop)))
    t.start()
    time.sleep(down_s)
    return {"stop": stop, "thread": t, "out": out}


def _end_load(load: dict) -> dict:
    """Stop the load (before the fault ends: what it saw was all seen while down)."""
    load["stop"].set()
    load["thread"].join(60)
    return load["out"]


def db_down(fs: FaultStack, down_s: float) -> dict:
    long = fs.start_long(2, 1, down_s + 2)
    t_down = time.monotonic()
    fs.pg.stop()  # fast shutdown: every connection cut
    load = _during(fs, down_s)
    seen = _end_load(load)
    fs.pg.start()
    t_end = time.monotonic()
    # What the supervisors ride out is the fault plus PostgreSQL's own stop and start, which
    # take seconds on a loaded machine: it is in the row, and in the message if a job gave up.
    outage = t_end - t_down
    assert seen["http"].get(503) and set(seen["http"]) == {503}, seen  # every answer
    assert not seen["bad_bodies"], seen
    assert set(seen["error_codes"]) == {"database_unavailable"}, seen
    row = fs.check(f"PostgreSQL down {down_s:.0f}s (outage {outage:.1f}s)",
                   recovery_s=fs.canary(t_end), http_down=seen)
    # Ridden out: the stages kept running, nothing was requeued, nothing ran a second time.
    assert all(fs.job(j)["attempt"] == 1 for j in long), [fs.job(j) for j in long]
    return row


def redis_down(fs: FaultStack, down_s: float) -> dict:
    long = fs.start_long(2, 1, down_s + 2)
    fs.redis.stop()  # SIGKILL, and it comes back empty: queued messages are lost too
    load = _during(fs, down_s)
    seen = _end_load(load)
    fs.redis.start()
    t_end = time.monotonic()
    assert seen["http"].get(201), seen  # submitting works without the broker
    assert not any(c >= 500 for c in seen["http"] if isinstance(c, int)), seen
    row = fs.check(f"Redis down {down_s:.0f}s", recovery_s=fs.canary(t_end), http_down=seen)
    assert all(fs.job(j)["attempt"] == 1 for j in long)
    # Dispatches the broker refused went back to the queue at once (GPUs freed).
    assert fs.reasons()["broker unreachable; dispatch rolled back"] >= 1, fs.reasons()
    return row


def api_killed(fs: FaultStack, down_s: float) -> dict:
    long = fs.start_long(2, 1, down_s + 2)
    fs.stack.procs[0].kill(signal.SIGKILL)
    fs.stack.procs.pop(0)
    load = _during(fs, down_s)
    seen = _end_load(load)
    fs.restart_api()
    t_end = time.monotonic()
    assert seen["http"] == {"conn_error": seen["http"]["conn_error"]}, seen
    row = fs.check(f"API SIGKILL, {down_s:.0f}s down", recovery_s=fs.canary(t_end),
                   http_down=seen)
    assert all(fs.job(j)["attempt"] == 1 for j in long)
    return row


def worker_restarted(fs: FaultStack, down_s: float) -> dict:
    long = fs.start_long(2, 1, 6)
    fs.worker.kill(signal.SIGKILL)  # the worker's whole process group
    # A stage the dead worker left behind that did not die by itself (stuck): the restarted
    # worker must kill it before it requeues anything (fence by killing).
    stuck = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "workers.stages"],
        env={**fs.stack.env, "DRAFTYARD_NODE": NODE, PARENT_ENV: str(fs.worker.pid)},
        start_new_session=True)
    time.sleep(down_s)
    assert stuck.poll() is None
    fs.start_worker()  # same node name: its old jobs are requeued at registration
    assert stuck.wait(5) == -signal.SIGKILL
    t_end = time.monotonic()
    fs.wait(lambda: all((j := fs.job(i))["status"] == "running" and j["attempt"] == 2
                        for i in long), 60, "the killed jobs to run again")
    back = time.monotonic() - t_end
    rec = max(back, fs.canary(t_end))
    row = fs.check(f"worker SIGKILL, restarted after {down_s:.0f}s", recovery_s=rec)
    assert all(fs.job(j)["attempt"] == 2 for j in long)
    # Requeued by the restarted worker's registration, not by the reaper's timeout.
    assert fs.reasons(long)["worker on node f1 restarted; requeued"] == len(long), \
        fs.reasons(long)
    return row


@pytest.fixture
def short_stack():
    fs = FaultStack(stale_s=10).up()
    try:
        yield fs
    finally:
        fs.close()


FAULTS = [db_down, redis_down, worker_restarted, api_killed]


def chosen_faults(names: str | None) -> list:
    """The faults DRAFTYARD_FAULTS names (comma-separated; all when unset). A name that is
    no fault is an error, not a suite that passes having run nothing."""
    if names is None:
        return list(FAULTS)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {f.__name__: f for f in FAULTS}
    unknown = [n for n in wanted if n not in known]
    if unknown or not wanted:
        raise pytest.UsageError(f"DRAFTYARD_FAULTS={names!r} names no fault "
                                f"({', '.join(unknown) or 'empty'}); known: {', '.join(known)}")
    return [known[n] for n in wanted]


def test_chosen_faults_refuses_a_selection_that_runs_nothing():
    assert chosen_faults(None) == list(FAULTS)
    first = FAULTS[0].__name__
    assert chosen_faults(f" {first} ,") == [FAULTS[0]]
    for bad in ("", "no_such_fault", f"{first},typo"):
        with pytest.raises(pytest.UsageError, match="names no fault"):
            chosen_faults(bad)


def test_every_fault_briefly_jobs_end_once_and_never_run_twice(short_stack):
    ran = []
    for fault in chosen_faults(os.environ.get("DRAFTYARD_FAULTS")):
        fault(short_stack, 4.0)
        ran.append(fault.__name__)
    assert ran, "no fault ran"


@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS,
                         ids=lambda f: f.__name__)
def test_fault_20s_with_production_timings(fault):
    fs = FaultStack(stale_s=20).up()
    try:
        fault(fs, 20.0)
    finally:
        fs.close()


@pytest.mark.slow
def test_db_down_past_give_up_kills_the_stage_first_then_one_requeue():
    """An outage longer than a supervisor rides out (stale_after_s=2: it gives up after 3 s;
    the reaper requeues after fence_s = 9 s): the stage is killed while the DB is still down,
    before any new attempt can exist, and the job then runs once more and succeeds."""
    fs = FaultStack(stale_s=2).up()
    try:
        (jid,) = fs.start_long(1, 0, 12)
        # `running` is recorded at the claim, before the worker has started the stage.
        (pid,) = fs.wait(lambda: fs.sampler.snapshot().get(jid), 30, "the stage to start")
        fs.pg.stop()
        t0 = time.monotonic()
        fs.wait(lambda: not fs.sampler.snapshot().get(jid), 20, "the stage to be killed")
        killed_after = time.monotonic() - t0
        assert killed_after < 8, killed_after  # give_up_s = 3 (+ a connect timeout)
        print(f"stage killed {killed_after:.1f}s into the outage")
        time.sleep(max(0.0, 8 - killed_after))
        fs.pg.start()
        t_end = time.monotonic()
        j = fs.wait(lambda: (x := fs.job(jid))["attempt"] == 2 and x["status"] == "running"
                    and x, 60, "attempt 2 to run")
        assert fs.sampler.snapshot()[jid] != [pid]
        rec = max(time.monotonic() - t_end, fs.canary(t_end))
        fs.check("PostgreSQL down 8s > give-up 3s", recovery_s=rec)
        assert fs.job(jid)["attempt"] == 2, j
    finally:
        fs.close()
