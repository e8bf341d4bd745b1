from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.artifacts.schemas import ArtifactList, ArtifactRead
from app.core.deps import CurrentUser, PageDep, SessionDep
from app.core.errors import NotFound
from app.core.pagination import list_body, paginate
from app.core.reads import typed
from app.models import Artifact
from app.storage import delete
from contracts.roots import within_roots

router = APIRouter(prefix="/v1/artifacts", tags=["artifacts"])


def artifact_read(a: Artifact) -> dict:
    return {"id": a.id, "kind": a.kind, "uri": a.uri, "bytes": a.bytes, "files": a.files,
            "created_at": a.created_at, "producer_job": a.producer_job, "inputs": a.inputs,
            "meta": a.meta, "owner": a.owner_id, "deleted_at": a.deleted_at,
            "deleted_by": a.deleted_by, "bytes_freed": a.bytes_freed}


def _get(session: Session, art_id: str) -> Artifact:
    a = session.get(Artifact, art_id)
    if a is None:
        raise NotFound(f"artifact {art_id} not found", param="id")
    return a


@router.get("", response_model=ArtifactList)
def list_artifacts(*, kind: str | None = None, job_id: str | None = None,
                   page: PageDep, user: CurrentUser,
                   session: SessionDep):
    stmt = select(Artifact)
    if kind:
        stmt = stmt.where(Artifact.kind == kind)
    if job_id:
        stmt = stmt.where(Artifact.producer_job == job_id)
    rows, more, nxt = paginate(session, stmt, Artifact.id, page)
    return typed(list_body([artifact_read(a) for a in rows], more, nxt))


@router.get("/{art_id}", response_model=ArtifactRead)
def get_artifact(art_id: str, user: CurrentUser, session: SessionDep):
    return typed(artifact_read(_get(session, art_id)))


@router.delete("/{art_id}", response_model=ArtifactRead)
def delete_artifact(art_id: str, user: CurrentUser,
                    session: SessionDep):
    """Files removed, the row kept as a tombstone (app/storage/delete.py); 409 while in use."""
    return typed(artifact_read(delete.delete_artifact(session, user, _get(session, art_id))))


@router.get("/{art_id}/files/{path:path}")
def get_file(art_id: str, path: str, user: CurrentUser, session: SessionDep):
    a = _get(session, art_id)
    if a.deleted_at is not None:
        raise NotFound(f"artifact {art_id} was deleted at {a.deleted_at.isoformat()}; its "
                       f"files are gone", param="id", code="artifact_deleted", status=410)
    root = Path(a.uri).resolve()
    # contracts/roots.py: `..`, links out of the artifact and a NUL (which the filesystem
    # calls would answer with a ValueError, a 500) all come back as None.
    f = within_roots(path, [root])
    if f is None or not f.is_file():
        raise NotFound(f"artifact {art_id} has no file {path!r}", param="path")
    return FileResponse(f)
