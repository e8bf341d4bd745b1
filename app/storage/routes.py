"""Storage endpoints: usage, and pruning what retention would remove."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict

from app.core.deps import CurrentUser, SessionDep
from app.core.errors import Forbidden
from app.storage import retention, usage

router = APIRouter(prefix="/v1/storage", tags=["storage"])


class PruneBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dry_run: bool = False


@router.get("")
def storage(user: CurrentUser, session: SessionDep) -> dict:
    return usage.report(session)


@router.post("/prune")
def prune(body: PruneBody, user: CurrentUser,
          session: SessionDep) -> dict:
    """What retention would remove now (dry_run: anyone), or remove it (admins)."""
    if not body.dry_run and not user.is_admin:
        raise Forbidden("pruning is an admin action; dry_run: true lists what would go",
                        code="admin_only")
    items = retention.plan(session)
    freed = 0 if body.dry_run else retention.prune(session, items)
    return {"dry_run": body.dry_run, "items": [i.as_dict() for i in items],
            "bytes": sum(i.bytes for i in items), "bytes_freed": freed}
