"""Returns the GPUs of jobs whose heartbeat stopped and requeues them (bounded attempts,
infrastructure faults only) or fails them with `worker_lost`."""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.core.config import get_settings
from app.core.db import utcnow
from app.jobs.service import release_gpus, transition
from app.jobs.states import JobStatus as S
from app.models import Job, Node

log = logging.getLogger("draftyard.reaper")


def reap(session: Session) -> list[str]:
    s = get_settings()
    now = utcnow()
    cutoff = now - timedelta(seconds=s.stale_after_s)
    session.execute(update(Node).where(Node.last_heartbeat < cutoff, Node.alive.is_(True))
                    .values(alive=False))
    stale = list(session.scalars(select(Job).where(
        Job.status.in_((S.dispatched.value, S.running.value, S.cancelling.value)),
        Job.heartbeat_at < cutoff)))
    touched = []
    for job in stale:
        touched.append(job.id)
        release_gpus(session, job.id)
        if job.status == S.dispatched.value:
            # The message was lost or its worker died before claiming: not the job's fault.
            transition(session, job, S.queued, reason="dispatch not claimed in time; requeued",
                       node=None)
        elif job.status == S.cancelling.value:
            transition(session, job, S.cancelled, reason="worker lost while cancelling",
                       error={"code": "cancelled", "message": "cancelled (worker lost)"})
        elif job.attempt < job.max_attempts:
            log.warning("job %s lost its worker; requeueing (attempt %d)", job.id, job.attempt + 1)
            transition(session, job, S.queued, reason=f"worker on {job.node} lost; requeued",
                       attempt=job.attempt + 1, node=None, started_at=None, progress=None)
        else:
            transition(session, job, S.failed, error={
                "code": "worker_lost",
                "message": f"the worker running this job (node {job.node}) stopped "
                           f"heartbeating; gave up after {job.attempt} attempts"})
    if touched:
        from app.jobs import hooks

        for job in stale:
            if job.status in ("failed", "cancelled"):
                hooks.on_finished(session, job)
    return touched
