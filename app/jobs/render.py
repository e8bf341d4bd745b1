"""Job -> API object (one place, used by jobs, runs and queue views)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.jobs.service import gpus_of
from app.models import Job


def job_read(job: Job, gpus: list[dict] | None = None) -> dict:
    err = job.error
    return {
        "id": job.id, "type": job.type, "name": job.name, "owner": job.owner_id,
        "status": job.status, "priority": job.priority, "gpus_requested": job.gpus_requested,
        "gpus_assigned": gpus or [], "held": job.held, "node": job.node,
        "queue_position": job.queue_position if job.status in ("pending", "queued") else None,
        "pending_reason": job.pending_reason if job.status in ("pending", "queued") else None,
        "inputs": job.inputs, "params": job.params, "progress": job.progress,
        "outputs": job.outputs, "metrics_summary": job.metrics_summary or {},
        "error": err, "attempt": job.attempt, "reused_from": job.reused_from,
        "created_at": job.created_at, "started_at": job.started_at,
        "finished_at": job.finished_at, "run_id": job.run_id, "run_stage": job.run_stage,
    }


def jobs_read(session: Session, jobs: list[Job]) -> list[dict]:
    g = gpus_of(session, [j.id for j in jobs if j.status in ("dispatched", "running", "cancelling")])
    return [job_read(j, g.get(j.id)) for j in jobs]
