"""`Idempotency-Key`: the same key and user return the first answer again (24 h); the same key
with a different body is a 409."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import timedelta

from fastapi.encoders import jsonable_encoder
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.orm import Session

from app.core.auth import Principal
from app.core.db import is_sqlite, unit_of_work, utcnow
from app.core.errors import Conflict
from app.core.jsonresp import SafeJSONResponse
from app.core.reads import body_of
from app.models import IdempotencyKey

TTL = timedelta(hours=24)


def replay(user: Principal, key: str, body: object) -> SafeJSONResponse | None:
    """The stored answer of (user, key), checked in a short read-only transaction of its own:
    lets a slow handler (POST /v1/runs runs the plan first) answer a replay without redoing
    its work. `idempotent()` checks again inside the request's transaction."""
    with unit_of_work(read_only=True) as session:
        row = session.get(IdempotencyKey, (user.id, key[:200]))
        if row is None or _expired(row):
            return None
        if row.request_hash != _digest(body):
            raise Conflict("this Idempotency-Key was used with a different request body",
                           code="idempotency_key_reused", param="Idempotency-Key")
        return SafeJSONResponse(row.body, status_code=row.status_code,
                                headers={"Idempotent-Replayed": "true"})


def _digest(body: object) -> str:
    # The standard library, not orjson: a body may hold an integer past 64 bits (refused
    # later with a 422 naming it, but hashing it first must not be a 500).
    return hashlib.sha256(json.dumps(jsonable_encoder(body), sort_keys=True, default=str,
                                     ensure_ascii=True).encode()).hexdigest()


def _expired(row: IdempotencyKey) -> bool:
    return row.created_at < utcnow() - TTL


def _serialise(session: Session, user_id: str, key: str) -> None:
    """Concurrent requests with one key wait here for the first to commit, then replay its
    answer (without this, all of them missed the row and all but one failed on its primary
    key). PostgreSQL: a transaction-scoped advisory lock on the key; SQLite
    serialises writers on its own (app/core/db.py)."""
    if is_sqlite(session):
        return
    h = int.from_bytes(hashlib.sha256(f"{user_id}\0{key}".encode()).digest()[:8], "big",
                       signed=True)
    session.execute(text("SELECT pg_advisory_xact_lock(:h)"), {"h": h})


def idempotent(session: Session, user: Principal, key: str | None, body: object,
               make: Callable[[], BaseModel], status_code: int = 201) -> SafeJSONResponse:
    """Answer with `make()` (a read model) once per (user, key); replay the stored answer
    afterwards."""
    if not key:
        return SafeJSONResponse(jsonable_encoder(body_of(make(), user)), status_code=status_code)
    digest = _digest(body)
    _serialise(session, user.id, key[:200])
    row = session.get(IdempotencyKey, (user.id, key[:200]))
    if row is not None and _expired(row):
        session.delete(row)
        session.flush()
        row = None
    if row is not None:
        if row.request_hash != digest:
            raise Conflict("this Idempotency-Key was used with a different request body",
                           code="idempotency_key_reused", param="Idempotency-Key")
        return SafeJSONResponse(row.body, status_code=row.status_code,
                              headers={"Idempotent-Replayed": "true"})
    out = jsonable_encoder(body_of(make(), user))
    session.add(IdempotencyKey(user_id=user.id, key=key[:200], request_hash=digest,
                               status_code=status_code, body=out))
    session.flush()
    return SafeJSONResponse(out, status_code=status_code)
