"""Job -> its read model (one place, used by the jobs, runs and queue views)."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import Row, bindparam, select
from sqlalchemy.orm import Session

from app.core.config import get_settings
from app.core.db import read_connection, utcnow
from app.core.errors import NotFound
from app.jobs.preemption import HOUR_S, recent
from app.jobs.schemas import JobRead, PreemptionRead
from app.jobs.service import gpus_of
from app.jobs.states import LEASED, WAITING
from app.jobs.states import JobStatus as S
from app.models import Job


def preemption_of(job: Job | Row) -> PreemptionRead | None:
    """Why the job was last preempted, how often lately, and when it may resume (and be
    preempted again: not while it was preempted preempt_max_per_hour times within an hour)."""
    p = job.preemption
    if not p:
        return None
    hist = recent(p.get("history"), utcnow().timestamp())
    cap = get_settings().preempt_max_per_hour
    out = PreemptionRead(
        by=p.get("by"), by_priority=p.get("by_priority"), by_owner=p.get("by_owner"),
        at=p.get("at"), attempt=p.get("attempt"), node=p.get("node"), reason=p.get("reason"),
        count_last_hour=len(hist),
        protected_until=(datetime.fromtimestamp(min(hist) + HOUR_S, timezone.utc)
                         if len(hist) >= cap else None))
    if job.status in WAITING:
        out.may_resume = (f"as soon as {job.gpus_requested} GPUs are free on one node "
                          "(it keeps its place in the queue and resumes from its last "
                          "checkpoint); now: " + (job.pending_reason or "being scheduled"))
    return out


def job_model(job: Job | Row, gpus: list[dict] | None = None) -> JobRead:
    """`job`: the ORM row, or a Core row of the jobs table (`read_job`)."""
    waiting = job.status in WAITING
    return JobRead(
        id=job.id, type=job.type, name=job.name, owner=job.owner_id, status=job.status,
        priority=job.priority, gpus_requested=job.gpus_requested, gpus_assigned=gpus or [],
        held=job.held, node=job.node,
        queue_position=job.queue_position if waiting else None,
        pending_reason=job.pending_reason if waiting else None,
        inputs=job.inputs, params=job.params, progress=job.progress, outputs=job.outputs,
        metrics_summary=job.metrics_summary or {}, error=job.error, attempt=job.attempt,
        reused_from=job.reused_from, created_at=job.created_at, started_at=job.started_at,
        finished_at=job.finished_at, run_id=job.run_id, run_stage=job.run_stage,
        preemptible=job.preemptible,
        preempting_for=job.preempt_by if job.status == S.running else None,
        preemption=preemption_of(job))


def job_models(session: Session, jobs: list[Job]) -> list[JobRead]:
    g = gpus_of(session, [j.id for j in jobs if j.status in LEASED])
    return [job_model(j, g.get(j.id)) for j in jobs]


_BY_ID = select(Job.__table__).where(Job.id == bindparam("id"))


def read_job(job_id: str) -> JobRead:
    """GET /v1/jobs/{id}, the read every client polls: one statement on a read-only
    connection and the model built from its row, without a Session or an ORM instance."""
    with read_connection() as conn:
        row = conn.execute(_BY_ID, {"id": job_id}).first()
        if row is None:
            raise NotFound(f"job {job_id} not found", param="id")
        gpus = gpus_of(conn, [job_id]) if row.status in LEASED else {}
    return job_model(row, gpus.get(job_id))
