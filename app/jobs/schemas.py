"""Job resource schemas (API.md "Jobs")."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from app.core.bounds import JsonObject


class JobType(StrEnum):
    ingest = "ingest"
    mix = "mix"
    generate = "generate"
    prepare = "prepare"
    extract = "extract"
    train = "train"
    evaluate = "evaluate"
    probe = "probe"


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: JobType
    name: str | None = Field(None, max_length=200)
    priority: int = Field(50, ge=0, le=100)
    gpus: int = Field(0, ge=0, le=64)
    inputs: JsonObject = Field(default_factory=dict)
    params: JsonObject = Field(default_factory=dict)
    force: bool = False


class Progress(BaseModel):
    stage: str | None = None
    done: float | None = None
    total: float | None = None
    unit: str | None = None
    rate: float | None = None
    eta_s: float | None = None


class GpuRef(BaseModel):
    node: str
    index: int


class ErrorInfo(BaseModel):
    code: str
    message: str
    log_tail: str | None = None


class JobRead(BaseModel):
    id: str
    type: str
    name: str | None
    owner: str
    status: str
    priority: int
    gpus_requested: int
    gpus_assigned: list[GpuRef]
    held: bool
    node: str | None
    queue_position: int | None
    pending_reason: str | None
    inputs: dict[str, Any]
    params: dict[str, Any]
    progress: Progress | None
    outputs: list[str]
    metrics_summary: dict[str, Any]
    error: ErrorInfo | None
    attempt: int
    reused_from: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    run_id: str | None


class PriorityUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    priority: int = Field(ge=0, le=100)
