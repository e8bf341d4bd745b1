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


class ArtifactList(ReadModel):
    data: list[ArtifactRead]
    has_more: bool
    next_after: str | None
