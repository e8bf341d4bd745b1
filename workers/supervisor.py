"""Runs one stage as a child process in its own process group and turns what it reports into
job state: events, progress (with rate and ETA), heartbeats, cancel and preemption (SIGTERM to
the group, then SIGKILL after a grace period), and on exit the artifacts and the final status.

Never twice: a database outage does not end the watch; the stage keeps running and
its events wait in the events file while the supervisor retries with backoff. Only after
`give_up_s` without one successful heartbeat does it give up, and then it kills the stage's
process group first: the reaper requeues a job only once its heartbeat is `fence_s` old
(app/scheduler/reaper.py), by which time the old attempt is surely dead. The stage itself dies
with the worker process (procgroup.watch_parent), whichever thread started it.

Nothing outlives its attempt (docs/STYLE.md rule 17): the stage and all it starts carry the attempt's tag
(procgroup.TAG_ENV); when the stage ends, by any signal, the supervisor kills every process
left with that tag (torchrun's ranks live in sessions of their own, so the stage's process
group does not hold them), and before an attempt starts it kills whatever an earlier attempt
of the same job left.

A stop of the worker stops its stages now (`request_stop`): each stage is asked to save and
exit, killed after `stop_grace_s`, and its job requeued to resume from what it saved
(workers/runner.py), rather than the worker waiting minutes for a long stage to end.

A stage that died by a signal nobody of ours sent (the kernel's out-of-memory killer sends
SIGKILL) is told apart from one we stopped: `StageOutcome.outside_signal`, with the peak memory
of the attempt's processes sampled while it ran and the node's memory then
(procgroup/memory.py)."""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from app.core.config import get_settings
from app.core.db import db_now, unit_of_work, utcnow
from app.jobs.service import add_event
from app.models import Job
from app.scheduler.reaper import give_up_s
from app.jobs.states import JobStatus as S
from procgroup import ARGV_SLOT, PARENT_ENV, TAG_ENV, TAG_SLOT, AttemptProcesses, signal_group
from procgroup.memory import PeakMemory
from procgroup.warm import WarmChild, WarmStarter
from workers.attempt import Attempt
from workers.stages.starter import DATA_STAGES, MODEL_STAGES
from workers.stages.threads import threads_env

log = logging.getLogger("draftyard.supervisor")
REPO_ROOT = Path(__file__).resolve().parents[1]
LOST = "lost"  # _pump_events: this attempt no longer owns the job
PREEMPTING = "preempting"  # _pump_events: running, and the scheduler asked it to yield
BACKOFF_MAX_S = 2.0  # retry the DB at least this often during an outage: recovery is quick
# At most one progress event row per this many seconds of the stage's clock (the first and the
# final one always), and past PROGRESS_EVENTS rows the spacing grows with the elapsed time
# (elapsed / PROGRESS_EVENTS): the job's `progress` field still follows every report, while a
# job's rows grow with neither its record rate nor (beyond a logarithm) its duration: a
# 75-minute prepare writes ~1,000 progress rows, not 4,500.
PROGRESS_EVENT_S = 1.0
PROGRESS_EVENTS = 300
# Metric rows (the loss curve of GET /v1/jobs/{id}/metrics): every one until the spacing
# elapsed / METRIC_EVENTS exceeds the stage's logging interval; a 3-day train logging every
# second writes ~6,500 rows, not 259,200 (every point stays in its TensorBoard folder).
METRIC_EVENTS = 1000
RATE_WINDOW_S = 30.0


def _starter_env() -> dict[str, str]:
    """The model starter's environment: this worker's, with the stage's defaults, the tag's
    placeholder (each child writes its attempt's tag there, procgroup.set_proc_environ), this
    process as the parent its children belong to (workers/node.kill_orphans), and CUDA
    checked by NVML, not the runtime, if an import asks: a CUDA runtime started before a fork
    is unusable in the child (each child replaces this environment with its own)."""
    return {**_process_env(), TAG_ENV: TAG_SLOT, PARENT_ENV: str(os.getpid()),
            "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}


def _process_env() -> dict[str, str]:
    """What every process the supervisor starts runs with: this worker's environment, the
    repository on the path, unbuffered output (its log is read while it runs)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{REPO_ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    return env


# This worker process's warm starters, for model stages and for the streaming data stages,
# each started with the first stage it forks; gone with this process (they watch it).
def _warm_starter(name: str, profile: str, log_name: str) -> WarmStarter:
    starter = WarmStarter(name, [sys.executable, "-m", "workers.stages.starter",
                                 "--profile", profile, "--title-slot", ARGV_SLOT],
                          env=_starter_env,
                          log_path=lambda: get_settings().home / "workers" / log_name,
                          cwd=REPO_ROOT)
    atexit.register(starter.stop)
    return starter


STAGE_SERVER = _warm_starter("stages", "model", "starter.log")
DATA_SERVER = _warm_starter("data", "data", "starter-data.log")


class _Stop:
    """Set when this worker process is told to stop (a plain attribute: it is set from a
    signal handler, where taking a lock could deadlock)."""

    reason: str | None = None


STOP = _Stop()
# Signals a process raises on itself when it crashes (a bad access, an abort, a bad
# instruction): the stage's own failure, not a kill from outside.
SELF_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL,
                          signal.SIGABRT})


def request_stop(reason: str) -> None:
    """Stop every stage this process supervises, now: each watch loop sees it within a
    round, asks its stage to save and exit, kills it after `stop_grace_s`, and returns an
    outcome whose job is requeued (workers/runner.py). Called from the worker's shutdown
    signal handler (workers/celery_app.py): only sets a flag."""
    STOP.reason = STOP.reason or reason


class GaveUp(RuntimeError):
    """The database stayed unreachable for give_up_s; the stage's group was killed first."""


def retrying(fn, what: str, deadline_s: float):
    """Call fn() until it gets through to the database, with backoff, for at most deadline_s;
    then raise the last error. Other errors are not retried."""
    t0, delay, n = time.monotonic(), 0.1, 0
    while True:
        try:
            return fn()
        except SQLAlchemyError as e:  # DB down or restarting: try again
            n += 1
            if n == 1:
                log.warning("%s failed, retrying: %s", what, e)
            if time.monotonic() - t0 + delay > deadline_s:
                raise
            time.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)


@dataclass
class _Rate:
    """Progress rate over a sliding window that is half of the phase's elapsed time (at least
    RATE_WINDOW_S), for rate and ETA. A fixed 30 s window held a single point when a stage
    reports in chunks further apart (prepare's tasks, extract's shards on a busy node): no
    rate, no ETA; and a short window follows every jitter of a shared machine. Points are
    kept at most one per second, so the window costs O(1) per report."""

    points: deque = field(default_factory=deque)
    start: float = 0.0

    def add(self, t: float, done: float) -> float | None:
        pts = self.points
        if pts and done < pts[-1][1]:
            pts.clear()  # a new phase restarted its counter
        if not pts:
            self.start = t
        if not pts or t - pts[-1][0] >= 1.0:
            pts.append((t, done))
        window = max(RATE_WINDOW_S, (t - self.start) / 2)
        while len(pts) > 1 and t - pts[1][0] >= window:
            pts.popleft()
        t0, d0 = pts[0]
        return (done - d0) / (t - t0) if t > t0 and done > d0 else None


@dataclass
class _Spacing:
    """Which of a stream of reports get an event row: the first, then at most one per
    `floor_s` of the stage's clock, and at most one per elapsed / `rows` seconds (so past
    `rows` rows the spacing grows with the elapsed time: a job's rows grow with neither its
    report rate nor, beyond a logarithm, its duration)."""

    floor_s: float
    rows: int
    first: float | None = None
    last: float | None = None

    def due(self, t: float) -> bool:
        if self.first is None:
            self.first = t
        if self.last is not None and \
                t - self.last < max(self.floor_s, (t - self.first) / self.rows):
            return False
        self.last = t
        return True


@dataclass
class StageOutcome:
    returncode: int
    cancelled: bool
    error: dict | None
    result: dict | None
    artifacts: list[dict]
    # The job was taken from this worker (reaped and requeued, or failed) while the stage
    # ran: the stage was killed and nothing of this attempt may be recorded.
    lost: bool = False
    # The scheduler asked this attempt to yield its GPUs (workers/runner.py requeues it).
    preempted: bool = False
    # This worker was told to stop (request_stop: why); the stage was stopped, not failed.
    stopped: str | None = None
    # The stage died by this signal and nobody of ours sent one; `memory` then holds what
    # its processes and the node had (procgroup.memory.PeakMemory.report).
    outside_signal: int | None = None
    memory: dict | None = None


class Supervisor:
    def __init__(self, att: Attempt):
        """Supervise one attempt (workers/attempt.py: what to start, where it reports)."""
        self.job_id = att.job_id
        self.attempt: int | None = att.number
        self.type = att.type
        self.spec_path = att.spec_path
        self.job_dir = att.job_dir
        self.events_path = att.events_path
        self.gpus = att.gpus
        self.settings = get_settings()
        self._events_pos = 0
        self._rate = _Rate()
        self._progress_rows = _Spacing(PROGRESS_EVENT_S, PROGRESS_EVENTS)
        self._metric_rows = _Spacing(0.0, METRIC_EVENTS)
        self._metric_held: dict | None = None  # the newest metric not written (yet)
        self.error: dict | None = None
        self.result: dict | None = None
        self.artifacts: list[dict] = []
        self.proc: subprocess.Popen | WarmChild | None = None
        self.processes = AttemptProcesses(str(self.settings.home), att.job_id, att.number)
        self.memory = PeakMemory(self.processes.tag)
        self._signalled = False  # whether we (cancel, preemption, stop, fence) signalled it

    # -- child process --------------------------------------------------------------------
    def start(self) -> None:
        env = _process_env()
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in self.gpus)
        env.update(threads_env(env, self.settings.cpu_slots, len(self.gpus)))
        env["DRAFTYARD_JOB_ID"] = self.job_id
        env["TMPDIR"] = str(self.spec_path.parent)  # node-local scratch (workers/runner.py)
        log_path = self.job_dir / "log.txt"
        with open(log_path, "ab") as logf:
            logf.write(f"--- {utcnow().isoformat()} stage {self.type} starting "
                       f"(CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r})\n".encode())
        # The stage dies with this process, and so does everything it starts (procgroup);
        # leftovers of an earlier attempt of this job are killed first. A model stage or a
        # streaming data stage is forked by this worker's warm starter for it when it can be
        # (workers/stages/starter.py).
        warm = None
        server = (STAGE_SERVER if self.type in MODEL_STAGES else
                  DATA_SERVER if self.type in DATA_STAGES else None)
        if server is not None and self.settings.stage_server:
            def warm(env: dict[str, str]) -> WarmChild | None:
                assert server is not None
                return server.start({
                    "stage": self.type, "spec": str(self.spec_path), "cwd": str(self.job_dir),
                    "log": str(log_path), "env": env,
                    # what /proc shows of it, as of a fresh stage (procgroup's scans)
                    "proc_env": {TAG_ENV: env[TAG_ENV], "DRAFTYARD_JOB_ID": self.job_id}})
        self.proc = self.processes.start(
            [sys.executable, "-m", "workers.stages", self.type, "--spec", str(self.spec_path)],
            env=env, cwd=self.job_dir, log=log_path, warm=warm)
        if self.processes.stale:
            log.warning("job %s: killed %d process(es) an earlier attempt left: %s",
                        self.job_id, len(self.processes.stale), self.processes.stale)

        how = " (forked warm)" if isinstance(self.proc, WarmChild) else ""

        def _started():
            with unit_of_work() as s:
                add_event(s, self.job_id, "log",
                          {"message": f"stage started{how}, pid {self.proc.pid}"})
        retrying(_started, f"job {self.job_id}: start event", give_up_s())

    def _signal_group(self, sig: int) -> None:
        if self.proc is not None:  # started: a group of its own, whose id is its pid
            self._signalled = True
            signal_group(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the stage's whole group and everything of the attempt, and reap the leader
        (before giving the job up)."""
        if self.proc is not None:
            self._signal_group(signal.SIGKILL)
            self.proc.wait()
            self._sweep()

    def _sweep(self) -> None:
        """Kill what is left of this attempt once its stage is gone (torchrun and its ranks
        after a SIGKILLed stage, a vLLM engine process): nothing outlives the attempt."""
        left = self.processes.sweep()
        if left:
            log.warning("job %s attempt %s: killed %d process(es) the stage left: %s",
                        self.job_id, self.attempt, len(left), left)

    # -- the watch loop -------------------------------------------------------------------
    def _fence_by_time(self, limit: float, stop: threading.Event) -> None:
        """Give up on time even while a DB call hangs (a partition drops packets: a call may
        wait up to the TCP timeouts of app/core/db.py before it fails, past give_up_s and
        close to the reaper's fence_s): kill the stage once `limit` has passed since the last
        DB success; the watch loop then raises GaveUp whatever that call returns."""
        while not stop.wait(0.25):
            if time.monotonic() - self._last_ok > limit:
                log.error("job %s: no database answer for %.0fs; killing the stage",
                          self.job_id, limit)
                self._fenced = True
                self.kill()
                return

    def watch(self) -> StageOutcome:
        stop = threading.Event()
        dog = threading.Thread(target=self._fence_by_time, args=(give_up_s(), stop),
                               daemon=True, name=f"fence-{self.job_id}")
        self._last_ok = time.monotonic()
        self._fenced = False
        dog.start()
        try:
            return self._watch()
        finally:
            stop.set()

    def _watch(self) -> StageOutcome:
        assert self.proc is not None
        last_hb = 0.0
        retry_at = time.monotonic()  # next DB try in an outage
        delay = 0.0
        cancel_at: float | None = None
        grace = self.settings.cancel_grace_s
        preempted = False
        stopped: str | None = None
        killed = False
        limit = give_up_s()
        while True:
            rc = self.proc.poll()
            now = time.monotonic()
            if rc is None:
                self.memory.sample(self.proc.pid)
            if STOP.reason and rc is None and cancel_at is None:
                # This worker is stopping: do not wait for the stage to end (it may have
                # hours to go); it saves what it can within stop_grace_s.
                cancel_at, stopped = now, STOP.reason
                grace = self.settings.stop_grace_s
                log.warning("job %s: worker stopping (%s); stopping the stage", self.job_id,
                            stopped)
                self._signal_group(signal.SIGTERM)
            elif STOP.reason:  # a cancel or preemption under way ends within the stop's grace
                grace = min(grace, self.settings.stop_grace_s)
            # Before the database call: a grace ends on time during an outage too.
            if cancel_at is not None and not killed and rc is None and now - cancel_at > grace:
                self._signal_group(signal.SIGKILL)
                killed = True
            if now < retry_at:
                time.sleep(0.25)
                continue
            try:
                status = self._pump_events(heartbeat=now - last_hb >= self.settings.heartbeat_s,
                                           final=rc is not None)
                if self._fenced:  # killed by _fence_by_time while this call hung
                    raise GaveUp(f"database unreachable for {limit:.0f}s")
            except SQLAlchemyError as e:  # DB outage: the stage keeps running
                if delay == 0.0:
                    log.warning("job %s: DB unreachable, stage kept running: %s", self.job_id, e)
                if self._fenced or time.monotonic() - self._last_ok > limit:
                    # Fence: the reaper may requeue the job soon; nothing of ours may live on.
                    log.error("job %s: DB unreachable for %.0fs; killing the stage",
                              self.job_id, limit)
                    self.kill()
                    raise GaveUp(f"database unreachable for {limit:.0f}s") from e
                delay = min(max(delay * 2, 0.25), BACKOFF_MAX_S)
                retry_at = time.monotonic() + delay
                continue
            if delay:
                log.warning("job %s: DB back after %.1fs", self.job_id,
                            time.monotonic() - self._last_ok)
            self._last_ok, delay = time.monotonic(), 0.0
            if now - last_hb >= self.settings.heartbeat_s:
                last_hb = now
            if status == LOST:
                # Our lease is gone (the reaper gave the GPUs back, maybe to another job):
                # stop at once so no GPU carries two jobs and the job never runs twice.
                log.warning("job %s attempt %s: taken from this worker; killing the stage",
                            self.job_id, self.attempt)
                self.kill()
                return StageOutcome(-signal.SIGKILL, False, None, None, [], lost=True)
            if status in (S.cancelling, S.cancelled, PREEMPTING) and cancel_at is None:
                # The stage checkpoints on SIGTERM (train at its next step boundary).
                cancel_at = now
                preempted = status == PREEMPTING
                if preempted:
                    grace = self.settings.preempt_grace_s
                    log.info("job %s: preempted; asking the stage to checkpoint and exit",
                             self.job_id)
                self._signal_group(signal.SIGTERM)
            if rc is not None:
                # Stragglers (a vLLM server, torchrun and its ranks) go with the stage.
                self._sweep()
                outside = (-rc if rc < 0 and not self._signalled and -rc not in SELF_SIGNALS
                           else None)
                if outside is not None:
                    log.warning("job %s: the stage died by signal %d that nobody here sent",
                                self.job_id, outside)
                # The last events were read by the pump above (after the exit), committed.
                return StageOutcome(rc, cancel_at is not None and not (preempted or stopped),
                                    self.error, self.result, self.artifacts,
                                    preempted=preempted, stopped=stopped,
                                    outside_signal=outside,
                                    memory=self.memory.report() if outside else None)
            self._wait_exit(0.1 if cancel_at else 0.25)

    def _wait_exit(self, seconds: float) -> None:
        """Sleep between two rounds of the watch loop, waking at once when the stage exits:
        a short job is then recorded as finished when it is, not up to a round later."""
        assert self.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=seconds)

    def _pump_events(self, heartbeat: bool, final: bool = False) -> str | None:
        """Read new event lines into the DB; heartbeat; return the job's current status. The
        read position moves on only once the lines are committed: after a failed commit the
        same lines are read again (a DB outage loses no event). `final`: the stage has
        exited, so a metric held back by the spacing is written now."""
        lines: list[dict] = []
        end = 0
        if self.events_path.exists():
            with open(self.events_path, "rb") as fh:
                fh.seek(self._events_pos)
                chunk = fh.read()
            end = chunk.rfind(b"\n") + 1  # only whole lines; a partial one waits
            for raw in chunk[:end].splitlines():
                try:
                    lines.append(json.loads(raw))
                except ValueError:
                    continue
        if not lines and not heartbeat and not (final and self._metric_held is not None):
            self._events_pos += end
            with unit_of_work() as s:
                row = s.execute(select(Job.status, Job.attempt, Job.preempt_by)
                                .where(Job.id == self.job_id)).first()
                return self._status_if_ours(row)
        n_arts = len(self.artifacts)
        spacing = (replace(self._progress_rows), replace(self._metric_rows), self._metric_held)
        try:
            with unit_of_work() as s:
                job = s.get(Job, self.job_id)
                status = self._status_if_ours(job and (job.status, job.attempt, job.preempt_by))
                if job is None or status == LOST:  # (no row is LOST too)
                    return LOST  # another attempt's events and heartbeat are not ours to write
                for ev in lines:
                    self._apply(s, job, ev)
                if final and self._metric_held is not None:  # held by these lines, too
                    add_event(s, job.id, "metric", self._metric_held)
                    self._metric_held = None
                job.heartbeat_at = db_now(s)
        except BaseException:
            del self.artifacts[n_arts:]  # read again on the next try
            self._progress_rows, self._metric_rows, self._metric_held = spacing
            raise
        self._events_pos += end
        return status

    def _status_if_ours(self, row) -> str:
        """The job's status, or LOST when this attempt no longer owns it."""
        if row is None:
            return LOST
        status, attempt, preempt_by = row
        if status not in (S.running, S.cancelling, S.cancelled) or (
                self.attempt is not None and attempt != self.attempt):
            return LOST
        return PREEMPTING if status == S.running and preempt_by else status

    def _apply(self, s, job: Job, ev: dict) -> None:
        kind, data = ev.get("kind"), ev.get("data") or {}
        if kind == "progress":
            t = ev.get("at") or time.time()
            rate = self._rate.add(t, float(data.get("done") or 0))
            total, done = data.get("total"), data.get("done") or 0
            eta = (total - done) / rate if rate and total else None
            job.progress = {**data, "rate": rate, "eta_s": eta}
            if self._progress_rows.due(t) or (total and done >= total):
                add_event(s, job.id, "progress", job.progress)
        elif kind == "metric":
            # Spaced (METRIC_EVENTS); the last one is always written (_pump_events).
            if self._metric_rows.due(ev.get("at") or time.time()):
                add_event(s, job.id, kind, data)
                self._metric_held = None
            else:
                self._metric_held = data
        elif kind in ("warning", "log"):
            add_event(s, job.id, kind, data)
        elif kind == "artifact":
            self.artifacts.append(data)
        elif kind == "result":
            self.result = data
        elif kind == "error":
            self.error = data
