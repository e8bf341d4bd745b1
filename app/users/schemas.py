"""User and token response schemas (docs/API.md "Users")."""

from __future__ import annotations

from datetime import datetime

from app.core.reads import ReadModel
from app.models import User
from app.users.service import max_priority


class UserRead(ReadModel):
    id: str
    name: str
    role: str  # admin | member
    created_at: datetime
    max_priority: int  # the highest job priority the user may set (granted, or the role's)

    @classmethod
    def of(cls, u: User) -> UserRead:
        return cls(id=u.id, name=u.name, role=u.role, created_at=u.created_at,
                   max_priority=max_priority(u, u.role))


class UserCreated(UserRead):
    """The answer of `POST /v1/users`: the user and its first token, shown once."""
    token: str
    token_id: str  # the handle to revoke it with (DELETE /v1/tokens/{id})


class UserList(ReadModel):
    data: list[UserRead]
    has_more: bool
    next_after: str | None


class Me(ReadModel):
    """`GET /v1/users/me`: who the token belongs to."""
    id: str
    name: str
    role: str
    max_priority: int


class TokenCreated(ReadModel):
    """The answer of `POST /v1/users/{id}/tokens`: the secret, shown once."""
    id: str
    user_id: str
    token: str
    created_at: datetime
