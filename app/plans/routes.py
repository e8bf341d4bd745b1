from __future__ import annotations

from fastapi import APIRouter, Depends
from sqlalchemy.orm import Session

from app.core.auth import Principal, current_user
from app.core.db import request_session
from app.plans import service
from app.runs.schemas import RunCreate

router = APIRouter(prefix="/v1/plans", tags=["plans"])


@router.post("")
def create_plan(body: RunCreate, user: Principal = Depends(current_user),
                session: Session = Depends(request_session, scope="function")):
    return service.make_plan(session, body)
