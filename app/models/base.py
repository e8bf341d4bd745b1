from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import JSON, DateTime, MetaData
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import TypeDecorator

from app.core.db import utcnow

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """Every timestamp column: written as UTC, read back timezone-aware UTC on every backend.
    PostgreSQL's `timestamptz` keeps the offset, but SQLite (embedded mode) stores the text
    without it and hands back a naive datetime, which then cannot be compared with `utcnow()`
    ("can't compare offset-naive and offset-aware datetimes": GET /v1/storage after a failed
    job, tests/service/test_embedded.py). A naive value bound here is taken as UTC."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        # SQLite writes the wall time and drops the offset: convert first, or a non-UTC
        # aware value would be stored hours off.
        return _utc(value)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return _utc(value)


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None \
        else value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict: JSON, list: JSON, datetime: UTCDateTime()}


__all__ = ["Base", "UTCDateTime", "utcnow"]
