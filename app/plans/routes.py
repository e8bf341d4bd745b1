from __future__ import annotations

from fastapi import APIRouter

from app.core.db import unit_of_work
from app.core.deps import CurrentUser
from app.plans import service
from app.runs.names import with_ids
from app.runs.schemas import RunCreate
from app.storage.reserve import check_quota

router = APIRouter(prefix="/v1/plans", tags=["plans"])


@router.post("")
def create_plan(body: RunCreate, user: CurrentUser):
    # No request session: the plan reads in its own short transaction, then runs for seconds.
    with unit_of_work(read_only=True) as s:
        check_quota(s, user.id, user.name, "a plan")
    return service.make_plan(with_ids(body, user))
