"""Scheduler tests on the suite's shared PostgreSQL database."""

from __future__ import annotations

import pytest
from sqlalchemy import text


@pytest.fixture
def db(db):
    """The suite's `db`, in which a scheduling pass sees only what the test adds: the queued
    and pending jobs other tests left in the shared database held, their nodes removed (CPU
    slots are counted cluster-wide: a test placing a CPU job gives its nodes room for the
    others' running ones). All of it in the test's transaction, rolled back after it; a
    pass asserting exactly what it placed would otherwise place another test's job too (the
    suite runs in parallel, in any order)."""
    db.execute(text("UPDATE jobs SET held = true WHERE status IN ('queued', 'pending') "
                    "AND NOT held"))
    db.execute(text("DELETE FROM nodes"))
    db.flush()
    return db
