"""Side effects of a job reaching a final state, owned by the domain that cares:
a dataset becomes ready or failed when its ingest/mix job ends; a run updates its status."""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.models import Job


def on_finished(session: Session, job: Job) -> None:
    if job.type in ("ingest", "mix"):
        from app.datasets.service import on_ingest_finished

        on_ingest_finished(session, job)
    if job.run_id:
        from app.runs.service import refresh_run

        refresh_run(session, job.run_id)
