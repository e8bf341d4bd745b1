"""The one place that connects job lifecycle events to the domains that react to them.

Called by the app factory (`app.main.create_app`) and by the worker (`workers.celery_app`),
so that every process which changes a job's status runs the same consequences. The domains
never import each other for this: jobs announce, the rest subscribe (docs/STYLE.md 14)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.datasets.service import on_job_status as dataset_follows_job
from app.jobs.lifecycle import StatusChanged, subscribe, subscribe_place, subscribe_wake
from app.jobs.states import TERMINAL, JobStatus
from app.runs.service import on_job_status as run_follows_job
from app.jobs.service import add_event
from app.scheduler.nudge import nudge_after_commit, place_now
from app.scheduler.reads import no_gpu_node_reason
from app.scheduler.service import SCHEDULING
from app.storage.retention import on_job_status as retention_follows_job
from app.webhooks.service import on_job_status as webhooks_hear


def _wake_scheduler(session: Session, ev: StatusChanged) -> None:
    """A job became queued (more work) or ended (GPUs free, dependants may start): one
    scheduling pass after commit. A scheduling pass's own changes need none: it is the pass."""
    if session.info.get(SCHEDULING):
        return
    if ev.new == JobStatus.queued or JobStatus(ev.new) in TERMINAL:
        nudge_after_commit(session)


def _webhooks(session: Session, ev: StatusChanged) -> None:
    """The owner's webhooks hear of a job's end or preemption (outbox rows, same transaction)."""
    webhooks_hear(session, ev.job, ev.old, ev.new)


def _say_no_node_fits(session: Session, ev: StatusChanged) -> None:
    """A GPU job on a deployment with no node for it says so at submit, not at the next
    scheduler pass; the scheduler keeps the same reason while nothing changes."""
    if ev.old is None and (why := no_gpu_node_reason(session, ev.job.gpus_requested)):
        ev.job.pending_reason = why
        add_event(session, ev.job.id, "warning", {"message": why})


def wire() -> None:
    subscribe(dataset_follows_job)
    subscribe(run_follows_job)
    subscribe(retention_follows_job)
    subscribe(_wake_scheduler)
    subscribe(_webhooks)
    subscribe(_say_no_node_fits)
    subscribe_wake(nudge_after_commit)
    subscribe_place(place_now)
