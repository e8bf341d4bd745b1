from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from app.artifacts import service
from app.artifacts.schemas import ArtifactList, ArtifactRead
from app.core.deps import CurrentUser, PageDep, SessionDep
from app.core.errors import NotFound
from app.core.reads import typed
from app.storage import delete
from contracts.roots import within_roots

router = APIRouter(prefix="/v1/artifacts", tags=["artifacts"])


@router.get("", response_model=ArtifactList)
def list_artifacts(*, kind: str | None = None, job_id: str | None = None,
                   page: PageDep, user: CurrentUser,
                   session: SessionDep):
    rows, more, nxt = service.list_artifacts(session, page, kind=kind, job_id=job_id)
    return typed(ArtifactList(data=[ArtifactRead.of(a) for a in rows], has_more=more,
                              next_after=nxt), user=user)


@router.get("/{art_id}", response_model=ArtifactRead)
def get_artifact(art_id: str, user: CurrentUser, session: SessionDep):
    return typed(ArtifactRead.of(service.get_artifact(session, art_id)), user=user)


@router.delete("/{art_id}", response_model=ArtifactRead)
def delete_artifact(art_id: str, user: CurrentUser,
                    session: SessionDep):
    """Files removed, the row kept as a tombstone (app/storage/delete.py); 409 while in use."""
    art = service.get_artifact(session, art_id)
    return typed(ArtifactRead.of(delete.delete_artifact(session, user, art)), user=user)


@router.get("/{art_id}/files/{path:path}")
def get_file(art_id: str, path: str, user: CurrentUser, session: SessionDep):
    a = service.get_artifact(session, art_id)
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
