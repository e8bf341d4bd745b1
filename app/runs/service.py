"""Runs: a chain of jobs submitted at once (filled in by the runs issue)."""

from __future__ import annotations

from sqlalchemy.orm import Session


def refresh_run(session: Session, run_id: str) -> None:
    from app.models import Run

    run = session.get(Run, run_id)
    if run is None:
        return
