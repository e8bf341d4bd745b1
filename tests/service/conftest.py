"""Fixtures of the in-process service tests (on the rolled-back `db` session)."""

from __future__ import annotations

import uuid

import pytest

from app.core.auth import Principal
from app.core.ids import new_id
from app.models import User


@pytest.fixture
def user(db) -> Principal:
    """A member, as the services see the caller."""
    u = User(id=new_id("usr"), name=f"u-{uuid.uuid4().hex[:8]}", role="member")
    db.add(u)
    db.flush()
    return Principal(u.id, u.name, u.role)
