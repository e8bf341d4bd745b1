"""`Idempotency-Key`: the same key and user return the first answer again (24 h); the same key
with a different body is a 409."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import timedelta

import orjson
from fastapi.encoders import jsonable_encoder
from fastapi.responses import ORJSONResponse
from sqlalchemy.orm import Session

from app.core.auth import Principal
from app.core.db import unit_of_work, utcnow
from app.core.errors import Conflict
from app.models import IdempotencyKey

TTL = timedelta(hours=24)


def replay(user: Principal, key: str, body: object) -> ORJSONResponse | None:
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
        return ORJSONResponse(row.body, status_code=row.status_code,
                              headers={"Idempotent-Replayed": "true"})


def _digest(body: object) -> str:
    return hashlib.sha256(orjson.dumps(jsonable_encoder(body), option=orjson.OPT_SORT_KEYS)).hexdigest()


def _expired(row: IdempotencyKey) -> bool:
    return row.created_at.replace(tzinfo=row.created_at.tzinfo or utcnow().tzinfo) < utcnow() - TTL


def idempotent(session: Session, user: Principal, key: str | None, body: object,
               make: Callable[[], object], status_code: int = 201) -> ORJSONResponse:
    """Answer with `make()` once per (user, key); replay the stored answer afterwards."""
    if not key:
        return ORJSONResponse(jsonable_encoder(make()), status_code=status_code)
    digest = _digest(body)
    row = session.get(IdempotencyKey, (user.id, key[:200]))
    if row is not None and _expired(row):
        session.delete(row)
        session.flush()
        row = None
    if row is not None:
        if row.request_hash != digest:
            raise Conflict("this Idempotency-Key was used with a different request body",
                           code="idempotency_key_reused", param="Idempotency-Key")
        return ORJSONResponse(row.body, status_code=row.status_code,
                              headers={"Idempotent-Replayed": "true"})
    out = jsonable_encoder(make())
    session.add(IdempotencyKey(user_id=user.id, key=key[:200], request_hash=digest,
                               status_code=status_code, body=out))
    session.flush()
    return ORJSONResponse(out, status_code=status_code)
