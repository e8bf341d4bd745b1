from __future__ import annotations

from fastapi import APIRouter

from app.core.deps import CurrentUser
from app.plans import service
from app.runs.schemas import RunCreate

router = APIRouter(prefix="/v1/plans", tags=["plans"])


@router.post("")
def create_plan(body: RunCreate, user: CurrentUser):
    # No request session: the plan reads in its own short transaction, then runs for seconds.
    return service.make_plan(body)
