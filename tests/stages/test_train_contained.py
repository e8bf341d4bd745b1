"""Nothing a job starts outlives it: a train stage with `nproc: 2` (torchrun, DDP
on gloo; torchrun puts each rank in a session of its own) is SIGKILLed mid-train, either its
process group (what the supervisor's grace ends with, what the OOM killer does) or the whole
process group of the worker that supervises it. Within 5 s no process of the job is left
(sampled from /proc, by the attempt tag every descendant inherits), nothing writes into the
job's folder afterwards, and the retried attempt is the only one that runs and writes there.

The worker here is a stand-in process that does what workers/supervisor.py does with a stage,
through the same code (procgroup.AttemptProcesses: start it, wait for it, sweep), in a process group
of its own like a real worker; the stage, torchrun and the ranks are the real ones."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from procgroup import TAG_ENV, job_tag
from tests.stages import train_support as ts

REPO = Path(__file__).resolve().parents[2]
DEPLOYMENT = "contained-test"
JOB = "job-contained"

# The worker: start the attempt's stage, wait for it, sweep what it left (as Supervisor does).
WORKER = """
import os, sys
from pathlib import Path
from procgroup import AttemptProcesses
deployment, job, attempt, spec = sys.argv[1:5]
a = AttemptProcesses(deployment, job, int(attempt))
log = Path(spec).parent / f"stage-{attempt}.log"
warm = None
if sys.argv[5] == "warm":  # forked by this worker's warm starter, as Supervisor.start does
    from workers.supervisor import STAGE_SERVER

    def warm(env):
        return STAGE_SERVER.start({"stage": "train", "spec": spec, "cwd": str(Path(spec).parent),
                                   "log": str(log), "env": env,
                               "proc_env": {"DRAFTYARD_ATTEMPT": a.tag, "DRAFTYARD_JOB_ID": job}})
p = a.start([sys.executable, "-m", "workers.stages", "train", "--spec", spec],
            env=dict(os.environ), log=log, warm=warm)
assert (warm is None) == (type(p).__name__ == "Popen"), type(p)
print(p.pid, flush=True)
p.wait()
a.sweep()
"""


def job_processes() -> dict[int, str]:
    """Live processes of the job (any attempt), pid -> their attempt tag, from /proc."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "environ").read_bytes().decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        env = dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)
        if env.get(TAG_ENV, "").startswith(job_tag(DEPLOYMENT, JOB)) and state != "Z":
            found[int(d.name)] = env[TAG_ENV]
    return found


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def start_worker(spec_path: Path, attempt: int,
                 start: str = "fresh") -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DRAFTYARD_HOME": str(spec_path.parent),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    w = subprocess.Popen([sys.executable, "-c", WORKER, DEPLOYMENT, JOB, str(attempt),
                          str(spec_path), start], cwd=REPO, env=env, stdout=subprocess.PIPE,
                         text=True, start_new_session=True)
    return w, int(w.stdout.readline())


def folder_state(spec: dict) -> dict[str, tuple[int, int]]:
    """Every file under the job's folders (work, out, events) with its size and mtime."""
    out = {}
    for root in (Path(spec["work_dir"]), Path(spec["out_dir"]), Path(spec["events_path"]).parent):
        for p in root.rglob("*") if root.is_dir() else ():
            if p.is_file() and not p.name.startswith("stage-"):  # the workers' own logs
                st = p.stat()
                out[str(p)] = (st.st_size, st.st_mtime_ns)
    return out


def _wait_step(spec: dict, step: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = [e["data"]["step"] for e in ts.events(spec, "metric")]
        if steps and steps[-1] >= step:
            return
        time.sleep(0.1)
    raise AssertionError(f"no metric for step {step} within {timeout} s")


def _sample_until_empty(t_kill: float, window_s: float = 5.0) -> list[tuple[float, int]]:
    """(seconds since the kill, processes of the job alive) every 0.1 s for window_s."""
    samples = []
    while (t := time.monotonic() - t_kill) < window_s:
        samples.append((round(t, 2), len(job_processes())))
        time.sleep(0.1)
    return samples


# Each case takes a minute or more of two training ranks (several on a loaded box), like
# test_train_resume's DDP test: `make test-all`. The mechanisms themselves (the tag sweep,
# the ranks' death signal) are checked in seconds by tests/test_procgroup.py in `make test`.
@pytest.mark.slow
@pytest.mark.parametrize("mode, kill, start", [
    ("offline", "stage_group", "fresh"), ("online", "stage_group", "fresh"),
    ("offline", "worker_group", "fresh"), ("online", "worker_group", "fresh"),
    # Forked by the worker's warm starter (workers/stages/starter.py): the stage is the
    # server's child, in a session of neither the worker nor the server.
    ("offline", "stage_group", "warm"), ("online", "worker_group", "warm")])
@pytest.mark.timeout(1200)  # two attempts of two training ranks; minutes on a loaded box
def test_sigkill_mid_train_leaves_no_process_and_only_the_retry_writes(train_data, tmp_path,
                                                                       mode, kill, start):
    target, tok, hs = train_data
    params = ts.dflash_params(max_steps=16, checkpoint_every=2, log_every=1, nproc=2)
    if mode == "online":  # hidden states from the HF target inside each rank
        params = {**params, "mode": "online",
                  "drafter": {**params["drafter"], "target_layer_ids": ts.LAYER_IDS}}
    spec = ts.train_spec(tmp_path, target, tok, hs if mode == "offline" else None, params)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))

    worker, stage = start_worker(spec_path, 1, start)
    samples: list[tuple[float, int]] = []
    try:
        _wait_step(spec, 3)
        procs = job_processes()
        # The stage, torchrun and two ranks, the ranks in sessions of their own.
        assert len(procs) >= 4, procs
        assert len({_sid(p) for p in procs} - {None}) >= 3, procs
        t_kill = time.monotonic()
        os.killpg(stage if kill == "stage_group" else worker.pid, signal.SIGKILL)
        samples = _sample_until_empty(t_kill)
    finally:
        with_left = job_processes()
        for p in with_left:  # do not leave a failed run's processes behind on the box
            os.kill(p, signal.SIGKILL)
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    print(f"{mode} {kill}: /proc samples (s since SIGKILL, job processes): {samples}")
    gone_at = next((t for t, n in samples if n == 0), None)
    assert gone_at is not None and all(n == 0 for t, n in samples if t >= gone_at), (
        f"processes of the job still alive 5 s after the SIGKILL: {with_left}; {samples}")
    assert not with_left

    # Nothing of attempt 1 writes into the job's folder any more.
    before = folder_state(spec)
    time.sleep(2.0)
    assert folder_state(spec) == before

    # The retry: only its processes run, it resumes from a checkpoint and finishes.
    worker, stage = start_worker(spec_path, 2, start)
    seen: set[str] = set()
    while worker.poll() is None:
        seen |= set(job_processes().values())
        time.sleep(0.2)
    assert worker.returncode == 0
    assert seen == {job_tag(DEPLOYMENT, JOB) + "2"}, seen
    result = [e["data"] for e in ts.events(spec, "result")]
    assert result and result[-1]["steps"] == 16 and result[-1]["processes"] == 2, \
        (tmp_path / "stage-2.log").read_text()[-3000:]
    assert result[-1]["resumed_from_step"] >= 2
    assert not job_processes()
