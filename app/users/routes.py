from __future__ import annotations

from enum import StrEnum

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

from app.core.deps import AdminUser, CurrentUser, PageDep, SessionDep
from app.core.pagination import list_body
from app.users import service

router = APIRouter(prefix="/v1", tags=["users"])


class Role(StrEnum):
    admin = "admin"
    member = "member"


class UserCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.@-]+$")
    role: Role = Role.member


@router.post("/users", status_code=201)
def create_user(body: UserCreate, admin: AdminUser, session: SessionDep):
    user, tok, secret = service.create_user(session, body.name, body.role.value)
    # token_id: the handle to revoke it with (DELETE /v1/tokens/{id}) without a second call.
    return {"id": user.id, "name": user.name, "role": user.role, "created_at": user.created_at,
            "token": secret, "token_id": tok.id}


@router.get("/users")
def list_users(page: PageDep, user: CurrentUser,
               session: SessionDep):
    """The team's directory (id, name, role), readable by every member: jobs, runs and
    datasets name their owner by id, and clients show names (the queue already does)."""
    rows, more, nxt = service.list_users(session, page)
    return list_body([{"id": u.id, "name": u.name, "role": u.role, "created_at": u.created_at}
                      for u in rows], more, nxt)


@router.get("/users/me")
def me(user: CurrentUser):
    return {"id": user.id, "name": user.name, "role": user.role}


@router.post("/users/{user_id}/tokens", status_code=201)
def create_token(user_id: str, user: CurrentUser, session: SessionDep):
    tok, secret = service.new_token(session, user, user_id)
    return {"id": tok.id, "user_id": tok.user_id, "token": secret, "created_at": tok.created_at}


@router.delete("/tokens/{token_id}", status_code=204)
def delete_token(token_id: str, user: CurrentUser, session: SessionDep):
    service.revoke_token(session, user, token_id)
    return Response(status_code=204)
