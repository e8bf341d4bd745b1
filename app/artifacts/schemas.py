"""Artifact response schemas (docs/API.md "Artifacts")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app.core.reads import ReadModel
from app.models import Artifact


class ArtifactRead(ReadModel):
    id: str
    kind: str
    uri: str
    bytes: int
    files: list[dict[str, Any]]
    created_at: datetime
    producer_job: str | None
    inputs: list[str]
    meta: dict[str, Any]
    owner: str | None = None
    # A tombstone: the files were deleted, the row keeps the lineage.
    deleted_at: datetime | None = None
    deleted_by: str | None = None
    bytes_freed: int | None = None

    @classmethod
    def of(cls, a: Artifact) -> ArtifactRead:
        return cls(id=a.id, kind=a.kind, uri=a.uri, bytes=a.bytes, files=a.files,
                   created_at=a.created_at, producer_job=a.producer_job, inputs=a.inputs,
                   meta=a.meta, owner=a.owner_id, deleted_at=a.deleted_at,
                   deleted_by=a.deleted_by, bytes_freed=a.bytes_freed)


class ArtifactList(ReadModel):
    data: list[ArtifactRead]
    has_more: bool
    next_after: str | None
