"""Prometheus gauges, refreshed from the DB when scraped."""

from __future__ import annotations

from prometheus_client import Gauge
from sqlalchemy import func, select

from app.core.db import unit_of_work
from app.jobs.states import JobStatus
from app.models import Gpu, Job

JOBS = Gauge("draftyard_jobs", "Jobs by status", ["status"])
GPUS = Gauge("draftyard_gpus", "GPUs by state", ["state"])


def refresh() -> None:
    with unit_of_work(read_only=True) as s:
        counts = dict(s.execute(select(Job.status, func.count()).group_by(Job.status)).all())
        for st in JobStatus:
            JOBS.labels(st.value).set(counts.get(st.value, 0))
        total = s.scalar(select(func.count()).select_from(Gpu)) or 0
        busy = s.scalar(select(func.count()).select_from(Gpu).where(Gpu.job_id.isnot(None))) or 0
        GPUS.labels("busy").set(busy)
        GPUS.labels("free").set(total - busy)
