"""Job resource schemas (docs/API.md "Jobs")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from app.core.reads import ReadModel
from contracts.bounds import JsonObject
from contracts.jobtypes import JobType


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: JobType
    name: str | None = Field(None, max_length=200)
    priority: int = Field(50, ge=0, le=100)
    gpus: int = Field(0, ge=0, le=64)
    inputs: JsonObject = Field(default_factory=dict)
    params: JsonObject = Field(default_factory=dict)
    force: bool = False
    keep: bool | None = Field(
        default=None, description="keep this job's intermediates and scratch after it ends "
        "(retention); null: the server's default")
    preemptible: bool | None = Field(
        default=None, description="may the scheduler stop this job (it checkpoints and is requeued) "
        "for a higher-priority one; default true for train, false otherwise; only train, "
        "generate, extract and probe can be; false on a train job is admin only")


class PreemptibleUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    preemptible: bool


class Progress(BaseModel):
    model_config = ConfigDict(extra="allow")  # stages may report more (bytes, tokens/s, ...)
    stage: str | None = None
    # int | float: a count stays an int on the wire (pydantic would make 5 into 5.0)
    done: int | float | None = None
    total: int | float | None = None
    unit: str | None = None
    rate: int | float | None = None
    eta_s: int | float | None = None
    # A stage that goes through phases (evaluate: reference answers, target alone, with the
    # drafter, ...) names the one reporting and its place; `stage` then reads
    # "evaluate: with the drafter (3/6)" (workers/stages/evaluate/measure.py).
    phase: str | None = None
    phase_index: int | None = None
    phases: int | None = None


class GpuRef(ReadModel):
    node: str
    index: int


class ErrorInfo(BaseModel):
    model_config = ConfigDict(extra="allow")
    code: str
    message: str
    # What the stage attached, e.g. a failure budget's counts, failed_sample and
    # failures_file: without it the error names no record.
    details: Any = None
    log_tail: str | None = None


class PreemptionRead(ReadModel):
    """Why the job was last preempted, how often lately, when it may resume (API-additions)."""
    by: str | None
    by_priority: int | None
    by_owner: str | None
    at: str | None
    attempt: int | None
    node: str | None
    reason: str | None
    count_last_hour: int
    protected_until: datetime | None
    may_resume: str | None = None  # only while it waits


class JobRead(ReadModel):
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
    run_stage: str | None
    preemptible: bool = False
    preempting_for: str | None = None
    preemption: PreemptionRead | None = None


class JobList(ReadModel):
    data: list[JobRead]
    has_more: bool
    next_after: str | None


class PriorityUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    priority: int = Field(ge=0, le=100)
