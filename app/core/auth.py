"""Bearer tokens per user (stored hashed), roles admin/member."""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.config import get_settings
from app.core.db import unit_of_work
from app.core.errors import Forbidden, Unauthorized
from app.core.ids import new_id
from app.models import Token, User

TOKEN_PREFIX = "dy_"


@dataclass(frozen=True)
class Principal:
    id: str
    name: str
    role: str
    # The highest job priority the user may set, as the token lookup found it (cached with the
    # token: a change takes effect within the cache's ttl, as a revocation does); None where
    # the principal was built without it (check_priority then reads the user).
    top: int | None = None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


def max_priority(user: User | Any, role: str) -> int:
    """The highest job priority a user may set: granted by an admin (users.max_priority), else
    100 for admins and DRAFTYARD_MEMBER_MAX_PRIORITY for members. `user`: a User or a row
    with its max_priority; None: not known (the role's)."""
    granted = getattr(user, "max_priority", None)
    if granted is not None:
        return granted
    return 100 if role == "admin" else get_settings().member_max_priority


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def issue_token(session: Session, user: User) -> tuple[Token, str]:
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    tok = Token(id=new_id("tok"), user_id=user.id, hash=hash_token(secret))
    session.add(tok)
    session.flush()
    return tok, secret


class _TokenCache:
    """A short-lived cache of token -> principal: a read-heavy API should not pay a DB
    lookup per request. Revocation takes effect within `ttl` seconds."""

    def __init__(self, ttl: float = 5.0):
        self.ttl = ttl
        self._d: dict[str, tuple[float, Principal]] = {}
        self._lock = threading.Lock()

    def get(self, h: str) -> Principal | None:
        v = self._d.get(h)
        if v and v[0] > time.monotonic():
            return v[1]
        return None

    def put(self, h: str, p: Principal) -> None:
        with self._lock:
            if len(self._d) > 10_000:
                self._d.clear()
            self._d[h] = (time.monotonic() + self.ttl, p)

    def clear(self) -> None:
        with self._lock:
            self._d.clear()


token_cache = _TokenCache()


def lookup(session: Session, secret: str) -> Principal | None:
    h = hash_token(secret)
    p = token_cache.get(h)
    if p:
        return p
    row = session.execute(
        select(User.id, User.name, User.role, User.max_priority)
        .join(Token, Token.user_id == User.id)
        .where(Token.hash == h, Token.revoked_at.is_(None))).first()
    if row is None:
        return None
    p = Principal(row.id, row.name, row.role, max_priority(row, row.role))
    token_cache.put(h, p)
    return p


async def bearer_principal(header: str) -> Principal:
    """The caller named by an `Authorization` header value, or Unauthorized. Async: a cached
    token (the common case) costs no thread hop and no DB session; a miss looks it up in the
    thread pool. Also asked by the body cap (app/core/middleware.py) before it reads more than
    a few KiB of a request."""
    scheme, _, secret = header.partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'",
                           code="missing_token")
    p = token_cache.get(hash_token(secret))
    if p is None:
        p = await run_in_threadpool(_lookup_in_db, secret)
    if p is None:
        raise Unauthorized("the token is not valid (unknown or revoked)", code="invalid_token")
    return p


async def current_user(request: Request) -> Principal:
    """The caller, from `Authorization: Bearer <token>`."""
    p = await bearer_principal(request.headers.get("authorization", ""))
    request.state.user = p
    return p


def _lookup_in_db(secret: str) -> Principal | None:
    with unit_of_work(read_only=True) as s:
        return lookup(s, secret)


async def require_admin(user: Principal = Depends(current_user)) -> Principal:
    if not user.is_admin:
        raise Forbidden("this action needs an admin token", code="admin_only")
    return user


def _needs_token(dependant) -> bool:
    return any(d.call in (current_user, require_admin) or _needs_token(d)
               for d in dependant.dependencies)


async def caller_before_body(request: Request) -> None:
    """Unauthorized when the matched route needs a token this request lacks. FastAPI reads and
    parses a route's body before it resolves the route's dependencies, so a body it cannot
    parse would be answered 400 before the token was looked at: the error handlers of
    unparsable bodies (app/core/errors.py) ask this first, so a caller without a valid token
    learns 401 and nothing about what the route expects."""
    dependant = getattr(request.scope.get("route"), "dependant", None)
    if dependant is not None and _needs_token(dependant):
        await current_user(request)
