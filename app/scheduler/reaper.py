"""Returns the GPUs of jobs whose worker is gone and requeues them (bounded attempts,
infrastructure faults only) or fails them with `worker_lost`.

Never twice: a lease passes to a new attempt only when the old attempt's processes
are surely dead, never on a guess. Two facts make that sure:
- a supervisor that cannot heartbeat for `give_up_s` kills its stage's process group and
  gives up (workers/supervisor.py), and a stage dies with its worker process
  (procgroup.watch_parent); so a running job whose heartbeat is `fence_s` old
  (give_up_s plus a margin for a slow DB call) has no process left, whether its node is dead,
  cut off from the database, or alive;
- a worker (re)starting under a node name first kills what an earlier incarnation left on
  this machine (`kill_orphans`), then requeues that incarnation's jobs at once
  (`requeue_node`), without waiting for any heartbeat to age.
A job merely `dispatched` has no process yet: it is requeued after `stale_after_s`.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.core.config import get_settings
from app.cluster.service import first_live_node
from app.core.db import db_now, unit_of_work
from app.jobs.service import requeue, transition
from app.jobs.states import LEASED
from app.jobs.states import JobStatus as S
from app.models import Job, Node
from app.scheduler.service import try_lock

log = logging.getLogger("draftyard.reaper")


def give_up_s(settings=None) -> float:
    """How long a supervisor rides out a DB outage before it kills its stage: long enough for
    a 20-s outage with the default stale_after_s (20 -> 30 s)."""
    return 1.5 * (settings or get_settings()).stale_after_s


def fence_s(settings=None) -> float:
    """Heartbeat age after which a running job has surely no process left (see above)."""
    s = settings or get_settings()
    return give_up_s(s) + max(0.5 * s.stale_after_s, 6.0)


def reap(session: Session) -> list[str]:
    """Call under the scheduler lock. Returns the ids of the jobs it moved on."""
    s = get_settings()
    now = db_now(session)
    cutoff = now - timedelta(seconds=s.stale_after_s)
    fenced = now - timedelta(seconds=fence_s(s))
    session.execute(update(Node).where(Node.last_heartbeat < cutoff, Node.alive.is_(True))
                    .values(alive=False))
    # FOR UPDATE SKIP LOCKED: a worker finishing the job holds its row; re-read after the
    # lock, so a job that just ended is not requeued on a stale read.
    stale = [j for j in session.scalars(
        select(Job).where(Job.status.in_(LEASED), Job.heartbeat_at < cutoff)
        .with_for_update(skip_locked=True))
        if j.status == S.dispatched.value or j.heartbeat_at < fenced]
    return _move_on(session, stale, "lost")


def requeue_node(session: Session, node: str, worker: str | None = None) -> list[str]:
    """A worker registering as `node` (after kill_orphans): the jobs an earlier worker
    incarnation held there are dead; requeue them now, not after fence_s. `worker`: this
    incarnation's id (its own jobs, if any, are left alone)."""
    jobs = [j for j in session.scalars(
        select(Job).where(Job.status.in_(LEASED), Job.node == node)
        .with_for_update(skip_locked=True)) if worker is None or j.worker != worker]
    return _move_on(session, jobs, "restarted")


def _move_on(session: Session, jobs: list[Job], why: str) -> list[str]:
    for job in jobs:
        where = f"node {job.node}" if job.node else "its worker"
        if job.status == S.dispatched.value:
            # The message was lost or its worker died before claiming: not the job's fault.
            transition(session, job, S.queued, reason="dispatch not claimed in time; requeued",
                       node=None)
        elif job.status == S.cancelling.value:
            transition(session, job, S.cancelled, reason=f"worker {why} while cancelling",
                       error={"code": "cancelled", "message": f"cancelled (worker {why})"})
        elif job.attempt < job.max_attempts:
            log.warning("job %s: worker on %s %s; requeueing (attempt %d)", job.id, where, why,
                        job.attempt + 1)
            requeue(session, job, f"worker on {where} {why}; requeued", fault=True)
        else:
            transition(session, job, S.failed, error={
                "code": "worker_lost",
                "message": f"the worker running this job ({where}) "
                           f"{'stopped heartbeating' if why == 'lost' else 'was restarted'}; "
                           f"gave up after {job.attempt} attempts"})
    return [j.id for j in jobs]


# ---- the API's reaper: when no worker is alive -------------------------

def reap_unattended(session: Session) -> list[str] | None:
    """Reap when no worker node is alive to do it (a worker's housekeeping reaps while one
    is: workers/node.py). Under the scheduler's advisory lock, only tried: while a pass or
    another API replica holds it, this one skips its turn (None)."""
    if first_live_node(session) is not None or not try_lock(session):
        return None
    return reap(session)


class ApiReaper:
    """A thread of each API process (started and stopped by app.main) that reaps lost jobs
    and frees their GPUs while no worker is alive, every `heartbeat_s`."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="api-reaper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _loop(self) -> None:
        while not self._stop.wait(get_settings().heartbeat_s):
            try:
                with unit_of_work() as s:
                    moved = reap_unattended(s)
                if moved:
                    log.warning("no worker alive: the API requeued or failed %d lost job(s): %s",
                                len(moved), moved)
            except Exception:  # the DB may be down; the next tick retries
                log.exception("API reaper tick failed")
