from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.models.base import Base, utcnow


class Target(Base):
    __tablename__ = "targets"
    # A name is unique per owner: run bodies and the CLI may name it.
    __table_args__ = (Index("uq_targets_owner_name", "owner_id", "name", unique=True),)
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    path: Mapped[str] = mapped_column(Text)
    tokenizer_path: Mapped[str] = mapped_column(Text)
    chat_template: Mapped[str | None] = mapped_column(Text, default=None)
    # Listings show the template by these, not whole.
    chat_template_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    chat_template_chars: Mapped[int | None] = mapped_column(default=None)
    chat_template_kwargs: Mapped[dict] = mapped_column(default=dict)
    architecture: Mapped[str | None] = mapped_column(String(200), default=None)
    hidden_size: Mapped[int | None] = mapped_column(default=None)
    num_layers: Mapped[int | None] = mapped_column(default=None)
    vocab_size: Mapped[int | None] = mapped_column(default=None)
    has_chat_template: Mapped[bool] = mapped_column(default=False)
    config: Mapped[dict] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Dataset(Base):
    __tablename__ = "datasets"
    __table_args__ = (Index("uq_datasets_owner_name", "owner_id", "name", unique=True),)
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    status: Mapped[str] = mapped_column(String(20))  # ingesting | ready | failed
    format: Mapped[str | None] = mapped_column(String(40), default=None)
    source: Mapped[dict] = mapped_column(default=dict)
    num_records: Mapped[int | None] = mapped_column(default=None)
    num_rejected: Mapped[int | None] = mapped_column(default=None)
    rejected_sample: Mapped[list] = mapped_column(default=list)
    stats: Mapped[dict] = mapped_column(default=dict)
    artifact_id: Mapped[str | None] = mapped_column(String(40), default=None)
    job_id: Mapped[str | None] = mapped_column(String(40), default=None)
    error: Mapped[dict | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Artifact(Base):
    __tablename__ = "artifacts"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    kind: Mapped[str] = mapped_column(String(20), index=True)
    uri: Mapped[str] = mapped_column(Text)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    files: Mapped[list] = mapped_column(default=list)
    producer_job: Mapped[str | None] = mapped_column(String(40), default=None, index=True)
    inputs: Mapped[list] = mapped_column(default=list)
    meta: Mapped[dict] = mapped_column(default=dict)
    owner_id: Mapped[str | None] = mapped_column(String(40), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # A tombstone (app/storage/delete.py): the files are gone, the row keeps the lineage.
    # deleted_by: a user id, or "retention" when a retention rule removed it.
    deleted_at: Mapped[datetime | None] = mapped_column(default=None)
    deleted_by: Mapped[str | None] = mapped_column(String(40), default=None)
    bytes_freed: Mapped[int | None] = mapped_column(BigInteger, default=None)


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    spec: Mapped[dict] = mapped_column(default=dict)
    status: Mapped[str] = mapped_column(String(20), default="pending")
    report: Mapped[dict | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
