from __future__ import annotations

from enum import StrEnum

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

from app.core.deps import AdminUser, CurrentUser, PageDep, SessionDep
from app.core.reads import typed
from app.models import User
from app.users import service
from app.users.schemas import Me, TokenCreated, UserCreated, UserList, UserRead

router = APIRouter(prefix="/v1", tags=["users"])


class Role(StrEnum):
    admin = "admin"
    member = "member"


MAX_PRIORITY = Field(None, ge=0, le=100, description=(
    "the highest job priority the user may set; null: the role's default (members "
    "DRAFTYARD_MEMBER_MAX_PRIORITY, 50; admins 100)"))


class UserCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.@-]+$")
    role: Role = Role.member
    max_priority: int | None = MAX_PRIORITY


class UserUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_priority: int | None = MAX_PRIORITY


@router.post("/users", status_code=201, response_model=UserCreated)
def create_user(body: UserCreate, admin: AdminUser, session: SessionDep):
    user, tok, secret = service.create_user(session, body.name, body.role.value,
                                            body.max_priority)
    # token_id: the handle to revoke it with (DELETE /v1/tokens/{id}) without a second call.
    return typed(UserCreated(**dict(UserRead.of(user)), token=secret, token_id=tok.id),
                 status_code=201)


@router.patch("/users/{user_id}", response_model=UserRead)
def update_user(user_id: str, body: UserUpdate, admin: AdminUser,
                session: SessionDep):
    """An admin grants (or withdraws, with null) a user's priority band."""
    return typed(UserRead.of(service.set_max_priority(session, user_id, body.max_priority)))


@router.get("/users", response_model=UserList)
def list_users(page: PageDep, user: CurrentUser,
               session: SessionDep):
    """The team's directory (id, name, role), readable by every member: jobs, runs and
    datasets name their owner by id, and clients show names (the queue already does)."""
    rows, more, nxt = service.list_users(session, page)
    return typed(UserList(data=[UserRead.of(u) for u in rows], has_more=more, next_after=nxt))


@router.get("/users/me", response_model=Me)
def me(user: CurrentUser, session: SessionDep):
    row = session.get(User, user.id)
    return typed(Me(id=user.id, name=user.name, role=user.role,
                    max_priority=service.max_priority(row, user.role)))


@router.post("/users/{user_id}/tokens", status_code=201, response_model=TokenCreated)
def create_token(user_id: str, user: CurrentUser, session: SessionDep):
    tok, secret = service.new_token(session, user, user_id)
    return typed(TokenCreated(id=tok.id, user_id=tok.user_id, token=secret,
                              created_at=tok.created_at), status_code=201)


@router.delete("/tokens/{token_id}", status_code=204)
def delete_token(token_id: str, user: CurrentUser, session: SessionDep):
    service.revoke_token(session, user, token_id)
    return Response(status_code=204)
