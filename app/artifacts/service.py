"""Artifact reads (the delete and its tombstone: app/storage/delete.py)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.errors import NotFound
from app.core.pagination import Page, paginate
from app.models import Artifact


def get_artifact(session: Session, art_id: str) -> Artifact:
    a = session.get(Artifact, art_id)
    if a is None:
        raise NotFound(f"artifact {art_id} not found", param="id")
    return a


def list_artifacts(session: Session, page: Page, *, kind: str | None = None,
                   job_id: str | None = None):
    stmt = select(Artifact)
    if kind:
        stmt = stmt.where(Artifact.kind == kind)
    if job_id:
        stmt = stmt.where(Artifact.producer_job == job_id)
    return paginate(session, stmt, Artifact.id, page)
