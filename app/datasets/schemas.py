"""Dataset response schemas (docs/API.md "Datasets")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app.core.reads import ReadModel
from app.models import Dataset


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

    @classmethod
    def of(cls, d: Dataset) -> DatasetRead:
        return cls(id=d.id, name=d.name, status=d.status, format=d.format,
                   num_records=d.num_records, num_rejected=d.num_rejected,
                   rejected_sample=d.rejected_sample or [], stats=d.stats or {},
                   artifact_id=d.artifact_id, job_id=d.job_id, source=d.source, error=d.error,
                   created_at=d.created_at, owner=d.owner_id)


class DatasetList(ReadModel):
    data: list[DatasetRead]
    has_more: bool
    next_after: str | None
