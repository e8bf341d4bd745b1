"""Returns the GPUs of jobs whose worker is gone and requeues them (bounded attempts,
infrastructure faults only) or fails them with `worker_lost`.

A job is lost when its heartbeat is older than `stale_after_s` and its node has stopped
heartbeating too. A job whose node still heartbeats is only a slow one (a busy box, a long DB
stall): it is left alone until its own heartbeat is HUNG_FACTOR times staler, so a live stage
is not requeued beside itself. Should that happen anyway, the old attempt is fenced: its
supervisor sees the job is no longer its own, kills the stage and records nothing
(workers/supervisor.py, workers/runner.py).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.core.config import get_settings
from app.core.db import utcnow
from app.jobs.service import release_gpus, transition
from app.jobs.states import ACTIVE
from app.jobs.states import JobStatus as S
from app.models import Job, Node

log = logging.getLogger("draftyard.reaper")
HUNG_FACTOR = 5


def reap(session: Session) -> list[str]:
    """Call under the scheduler lock. Returns the ids of the jobs it moved on."""
    s = get_settings()
    now = utcnow()
    cutoff = now - timedelta(seconds=s.stale_after_s)
    hung = now - timedelta(seconds=s.stale_after_s * HUNG_FACTOR)
    session.execute(update(Node).where(Node.last_heartbeat < cutoff, Node.alive.is_(True))
                    .values(alive=False))
    live = set(session.scalars(select(Node.name).where(Node.alive.is_(True),
                                                       Node.last_heartbeat >= cutoff)))
    # FOR UPDATE SKIP LOCKED: a worker finishing the job holds its row; re-read after the
    # lock, so a job that just ended is not requeued on a stale read.
    stale = [j for j in session.scalars(
        select(Job).where(Job.status.in_(ACTIVE), Job.heartbeat_at < cutoff)
        .with_for_update(skip_locked=True))
        if j.node not in live or _aware(j.heartbeat_at, now) < hung]
    for job in stale:
        release_gpus(session, job.id)
        where = f"node {job.node}" if job.node else "its worker"
        if job.status == S.dispatched.value:
            # The message was lost or its worker died before claiming: not the job's fault.
            transition(session, job, S.queued, reason="dispatch not claimed in time; requeued",
                       node=None)
        elif job.status == S.cancelling.value:
            transition(session, job, S.cancelled, reason="worker lost while cancelling",
                       error={"code": "cancelled", "message": "cancelled (worker lost)"})
        elif job.attempt < job.max_attempts:
            log.warning("job %s lost its worker on %s; requeueing (attempt %d)", job.id, where,
                        job.attempt + 1)
            transition(session, job, S.queued, reason=f"worker on {where} lost; requeued",
                       attempt=job.attempt + 1, node=None, started_at=None, progress=None)
        else:
            transition(session, job, S.failed, error={
                "code": "worker_lost",
                "message": f"the worker running this job ({where}) stopped heartbeating; "
                           f"gave up after {job.attempt} attempts"})
    return [j.id for j in stale]


def _aware(t, ref):
    return t if t.tzinfo else t.replace(tzinfo=ref.tzinfo)
