"""Run submission (docs/API.md "Runs"). The body is `contracts.run.RunSpec`: the plan stage reads
and expands the same model, so both see the same jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app.core.reads import ReadModel
from app.jobs.schemas import JobRead
from contracts.run import DrafterSpec, RunSpec, Stages

RunCreate = RunSpec


class RunStage(ReadModel):
    job_id: str
    status: str
    progress: dict[str, Any] | None
    reused_from: str | None
    error: dict[str, Any] | None


class RunRead(ReadModel):
    id: str
    name: str
    owner: str
    status: str
    spec: dict[str, Any]
    jobs: list[JobRead]
    stages: dict[str, RunStage]
    report: dict[str, Any] | None
    created_at: datetime
    finished_at: datetime | None


class RunCreated(RunRead):
    plan: dict[str, Any]  # POST /v1/plans' answer for this run


class RunList(ReadModel):
    data: list[RunRead]
    has_more: bool
    next_after: str | None


__all__ = ["DrafterSpec", "RunCreate", "RunCreated", "RunList", "RunRead", "Stages"]
