"""Time, through one function: `utcnow()`, the database's clock as seen from this process.

With several machines each clock is its own, and a worker whose clock is two minutes off
would make every comparison of times written by different processes wrong: its heartbeats
would look two minutes stale (its jobs reaped and run again elsewhere while they still run)
or fresh long after it died, and as the reaping node it would reap everyone else's jobs
(tests/machines/test_clock.py). So the database's clock decides: `db_now(session)` reads the database's clock
(at most every SYNC_EVERY_S per process) and keeps the difference to the local clock;
`utcnow()` is the local clock plus that difference. Every lease, heartbeat and fencing time
is written and compared through these (heartbeats, claims, reaper and node cutoffs,
webhook claims call `db_now`, which re-reads the database's clock; the rest reuses the last
difference). SQLite is embedded: one machine, one clock, nothing to read.

DRAFTYARD_CLOCK_OFFSET_S shifts this process's local clock by that many seconds: a test (or
an operator checking a deployment) can run a worker whose clock is off without changing the
machine's clock; `db_now` corrects it like any real skew.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import datetime, timedelta, timezone

from sqlalchemy import text
from sqlalchemy.orm import Session

SYNC_EVERY_S = 1.0
_lock = threading.Lock()
_skew = timedelta(0)        # database clock minus local clock, as last measured
_synced_at: float | None = None  # monotonic time of the last measurement


def _offset() -> timedelta:
    try:
        return timedelta(seconds=float(os.environ.get("DRAFTYARD_CLOCK_OFFSET_S") or 0))
    except ValueError:
        return timedelta(0)


def local_now() -> datetime:
    """This machine's clock (plus DRAFTYARD_CLOCK_OFFSET_S): for logs, never for leases."""
    return datetime.now(timezone.utc) + _offset()


def utcnow() -> datetime:
    """The database's clock, from the local clock and the last measured difference."""
    return local_now() + _skew


def skew() -> timedelta:
    """Database clock minus local clock, as last measured (0 before the first `db_now`)."""
    return _skew


def db_now(session: Session, force: bool = False) -> datetime:
    """The database's clock now. Re-reads it when the last reading is older than
    SYNC_EVERY_S (or `force`), else returns `utcnow()` corrected by that reading."""
    global _skew, _synced_at
    if session.get_bind().dialect.name == "sqlite":
        return utcnow()
    t = time.monotonic()
    if not force and _synced_at is not None and t - _synced_at < SYNC_EVERY_S:
        return utcnow()
    before = local_now()
    # clock_timestamp(): the time now, not the transaction's start (now()).
    db: datetime = session.execute(text("SELECT clock_timestamp()")).scalar_one()
    after = local_now()
    if db.tzinfo is None:
        db = db.replace(tzinfo=timezone.utc)
    with _lock:
        _skew = db - (before + (after - before) / 2)
        _synced_at = time.monotonic()
    return db
