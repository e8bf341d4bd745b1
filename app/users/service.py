"""Users and tokens. The first admin is created by `draftyard up`/`server` on an empty DB."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.core.auth import Principal, issue_token, max_priority, token_cache
from app.core.config import get_settings
from app.core.db import utcnow
from app.core.errors import Conflict, Forbidden, NotFound
from app.core.ids import new_id
from app.core.pagination import Page, paginate
from app.models import Token, User


def list_users(session: Session, page: Page):
    return paginate(session, select(User), User.id, page)


def create_user(session: Session, name: str, role: str,
                max_priority: int | None = None) -> tuple[User, Token, str]:
    if session.scalar(select(User.id).where(User.name == name)):
        raise Conflict(f"a user named {name!r} already exists", param="name", code="name_taken")
    user = User(id=new_id("usr"), name=name, role=role, max_priority=max_priority)
    session.add(user)
    try:
        session.flush()
    except IntegrityError as e:
        raise Conflict(f"a user named {name!r} already exists", param="name",
                       code="name_taken") from e
    tok, secret = issue_token(session, user)
    return user, tok, secret


def check_priority(session: Session, actor: Principal, priority: int) -> None:
    """Priority bands: a job above its owner's max is refused, saying why."""
    top = actor.top if actor.top is not None else max_priority(session.get(User, actor.id),
                                                                actor.role)
    if priority > top:
        raise Forbidden(
            f"priority {priority} is above your band (0-{top}): a job preempts running jobs of "
            f"lower priority, so priorities above the members' default "
            f"{get_settings().member_max_priority} are granted per user by an admin "
            f"(PATCH /v1/users/{{id}} {{\"max_priority\": N}})", param="priority",
            code="priority_above_band", details={"priority": priority, "max_priority": top})


def set_max_priority(session: Session, user_id: str, value: int | None) -> User:
    user = session.get(User, user_id)
    if user is None:
        raise NotFound(f"user {user_id} not found", param="id")
    user.max_priority = value
    token_cache.clear()  # the band travels with a cached token (Principal.top)
    return user


def new_token(session: Session, actor: Principal, user_id: str) -> tuple[Token, str]:
    if not (actor.is_admin or actor.id == user_id):
        raise Forbidden("only an admin or the user may create tokens", code="admin_only")
    user = session.get(User, user_id)
    if user is None:
        raise NotFound(f"user {user_id} not found", param="id")
    return issue_token(session, user)


def revoke_token(session: Session, actor: Principal, token_id: str) -> None:
    tok = session.get(Token, token_id)
    if tok is None or not (actor.is_admin or tok.user_id == actor.id):
        raise NotFound(f"token {token_id} not found", param="id")
    tok.revoked_at = utcnow()
    token_cache.clear()


def ensure_admin(session: Session, home: Path) -> str | None:
    """Create the first admin and write its token to $DRAFTYARD_HOME/admin_token (0600)."""
    if session.scalar(select(User.id).where(User.role == "admin").limit(1)):
        return None
    _, _, secret = create_user(session, "admin", "admin")
    home.mkdir(parents=True, exist_ok=True)
    path = home / "admin_token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secret + "\n")
    os.chmod(path, 0o600)
    return secret
