"""Dataset response schemas (API.md "Datasets")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app.jobs.schemas import ReadModel


class DatasetRead(ReadModel):
    id: str
    name: str
    status: str  # ingesting | ready | failed
    format: str | None
    num_records: int | None
    num_rejected: int | None
    rejected_sample: list[dict[str, Any]]
    stats: dict[str, Any]
    artifact_id: str | None
    job_id: str | None
    source: dict[str, Any]
    error: dict[str, Any] | None
    created_at: datetime
    owner: str


class DatasetList(ReadModel):
    data: list[DatasetRead]
    has_more: bool
    next_after: str | None
