"""Artifact response schemas (API.md "Artifacts")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app.jobs.schemas import ReadModel


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
    # A tombstone (issue 23): the files were deleted, the row keeps the lineage.
    deleted_at: datetime | None = None
    deleted_by: str | None = None
    bytes_freed: int | None = None


class ArtifactList(ReadModel):
    data: list[ArtifactRead]
    has_more: bool
    next_after: str | None
