from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.models.base import Base, utcnow


class Node(Base):
    __tablename__ = "nodes"
    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    hostname: Mapped[str | None] = mapped_column(String(200), default=None)
    last_heartbeat: Mapped[datetime] = mapped_column(default=utcnow)
    draining: Mapped[bool] = mapped_column(default=False)
    alive: Mapped[bool] = mapped_column(default=True)
    cpu_slots: Mapped[int] = mapped_column(default=2)
    info: Mapped[dict] = mapped_column(default=dict)
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)


class Gpu(Base):
    __tablename__ = "gpus"
    node: Mapped[str] = mapped_column(ForeignKey("nodes.name", ondelete="CASCADE"),
                                      primary_key=True)
    index: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    name: Mapped[str | None] = mapped_column(String(200), default=None)
    memory_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)
    # The lease: at most one job holds a GPU; claimed under the scheduler lock.
    job_id: Mapped[str | None] = mapped_column(String(40), default=None, index=True)


class GpuLease(Base):
    """Lease history: proves after the fact that no GPU ever carried two jobs at once."""

    __tablename__ = "gpu_leases"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"),
                                    primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(40), index=True)
    owner_id: Mapped[str] = mapped_column(String(40), index=True)
    node: Mapped[str] = mapped_column(String(100))
    index: Mapped[int] = mapped_column()
    start_at: Mapped[datetime] = mapped_column(default=utcnow)
    end_at: Mapped[datetime | None] = mapped_column(default=None)

    __table_args__ = (Index("ix_gpu_leases_open", "node", "index", "end_at"),)


class Deployment(Base):
    """Facts of the whole deployment, one row per key. `shared_root`: the token of the marker
    file in the shared folder (DRAFTYARD_HOME) that every node proves it sees."""

    __tablename__ = "deployment"
    key: Mapped[str] = mapped_column(String(40), primary_key=True)
    value: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
