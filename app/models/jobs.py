from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.models.base import Base, utcnow


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    type: Mapped[str] = mapped_column(String(20), index=True)
    name: Mapped[str | None] = mapped_column(String(200), default=None)
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    status: Mapped[str] = mapped_column(String(20), index=True)
    priority: Mapped[int] = mapped_column(default=50)
    gpus_requested: Mapped[int] = mapped_column(default=0)
    held: Mapped[bool] = mapped_column(default=False)
    # Written by the scheduler on each pass for waiting jobs (API: queue_position, pending_reason).
    pending_reason: Mapped[str | None] = mapped_column(String(300), default=None)
    queue_position: Mapped[int | None] = mapped_column(default=None)
    max_attempts: Mapped[int] = mapped_column(default=3)
    node: Mapped[str | None] = mapped_column(String(100), default=None)
    inputs: Mapped[dict] = mapped_column(default=dict)
    params: Mapped[dict] = mapped_column(default=dict)
    depends_on: Mapped[list] = mapped_column(default=list)
    force: Mapped[bool] = mapped_column(default=False)
    progress: Mapped[dict | None] = mapped_column(default=None)
    outputs: Mapped[list] = mapped_column(default=list)
    metrics_summary: Mapped[dict] = mapped_column(default=dict)
    error: Mapped[dict | None] = mapped_column(default=None)
    attempt: Mapped[int] = mapped_column(default=1)
    fingerprint: Mapped[str | None] = mapped_column(String(64), default=None, index=True)
    reused_from: Mapped[str | None] = mapped_column(String(40), default=None)
    run_id: Mapped[str | None] = mapped_column(ForeignKey("runs.id"), default=None, index=True)
    # The job's key in its run (contracts/run.py StageJob.key): its stage, or `<stage>:<drafter>`.
    run_stage: Mapped[str | None] = mapped_column(String(64), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    queued_at: Mapped[datetime | None] = mapped_column(default=None)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    heartbeat_at: Mapped[datetime | None] = mapped_column(default=None)
    worker: Mapped[str | None] = mapped_column(String(200), default=None)
    # Preemption (app/scheduler/preempt.py): whether the scheduler may stop this job for a
    # higher-priority one; while it is being stopped, the job that waits for its GPUs; and
    # the last preemption ({by, by_priority, at, history: [epoch s in the last hour]}).
    preemptible: Mapped[bool] = mapped_column(default=False)
    preempt_by: Mapped[str | None] = mapped_column(String(40), default=None)
    preemption: Mapped[dict | None] = mapped_column(default=None)
    # Storage (app/storage/): keep its intermediates and scratch (None: the server default);
    # the disk it reserves on a volume while dispatched or running; its scratch (work_dir)
    # size measured when it ended, and when that scratch was removed.
    keep: Mapped[bool | None] = mapped_column(default=None)
    disk_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)
    disk_volume: Mapped[str | None] = mapped_column(String(40), default=None)
    scratch_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)
    scratch_removed_at: Mapped[datetime | None] = mapped_column(default=None)

    __table_args__ = (Index("ix_jobs_status_priority", "status", "priority", "queued_at"),)


class JobEvent(Base):
    __tablename__ = "job_events"
    # The global sequence doubles as the per-job `seq` (monotonic within a job too).
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"),
                                    primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    at: Mapped[datetime] = mapped_column(default=utcnow)
    kind: Mapped[str] = mapped_column(String(20))
    data: Mapped[dict] = mapped_column(default=dict)

    __table_args__ = (Index("ix_job_events_job_seq", "job_id", "id"),)
