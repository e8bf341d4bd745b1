"""Queue and cluster response schemas (docs/API.md "Queue and cluster")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app.core.reads import ReadModel
from app.jobs.schemas import JobRead


class QueueUser(ReadModel):
    """One owner's line in the queue view: what runs, what waits, and the last day's use."""
    id: str
    name: str | None
    running: int  # jobs (CPU jobs too)
    gpus_held: int
    gpu_hours_24h: float
    waiting: int
    gpus_waiting: int


class QueueRead(ReadModel):
    """`GET /v1/queue`: running jobs by start, waiting jobs in the order they will run."""
    running: list[JobRead]
    waiting: list[JobRead]
    quota_gpus: int | None  # per-user GPU quota; null: none
    users: list[QueueUser]


class NodeGpu(ReadModel):
    index: int
    name: str | None
    memory_bytes: int | None
    job_id: str | None  # the job holding it


class NodeRead(ReadModel):
    """A registered node: `alive` heartbeating within stale_after_s, `schedulable` alive and
    not draining (what the scheduler places jobs on)."""
    name: str
    hostname: str | None
    alive: bool
    draining: bool
    schedulable: bool
    last_heartbeat: datetime
    cpu_slots: int
    info: dict[str, Any]
    gpus_total: int
    gpus_free: int
    gpus: list[NodeGpu]


class NodeList(ReadModel):
    data: list[NodeRead]


class NodeDrain(ReadModel):
    """The answer of `POST /v1/nodes/{name}/drain` and `/undrain`."""
    name: str
    draining: bool
