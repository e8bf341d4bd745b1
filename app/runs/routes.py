from __future__ import annotations

from fastapi import APIRouter, Depends, Header
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.auth import Principal, current_user
from app.core.db import request_session
from app.core.idempotency import idempotent
from app.core.pagination import Page, list_body, page_params, paginate
from app.models import Run
from app.runs import service
from app.runs.schemas import RunCreate

router = APIRouter(prefix="/v1/runs", tags=["runs"])
DB = Depends(request_session, scope="function")


@router.post("", status_code=201)
def create_run(body: RunCreate, user: Principal = Depends(current_user), session: Session = DB,
               idempotency_key: str | None = Header(None)):
    def make():
        from app.plans.service import plan_or_refuse

        service.check_params(body)
        plan = plan_or_refuse(session, body)
        run = service.create_run(session, user, body)
        session.flush()
        out = service.run_read(session, run)
        out["plan"] = plan
        return out
    return idempotent(session, user, idempotency_key, body.model_dump(mode="json"), make)


@router.get("")
def list_runs(page: Page = Depends(page_params), user: Principal = Depends(current_user),
              session: Session = DB):
    rows, more, nxt = paginate(session, select(Run), Run.id, page)
    return list_body([service.run_read(session, r) for r in rows], more, nxt)


@router.get("/{run_id}")
def get_run(run_id: str, user: Principal = Depends(current_user), session: Session = DB):
    return service.run_read(session, service.get_run(session, run_id))


@router.get("/{run_id}/report")
def get_run_report(run_id: str, user: Principal = Depends(current_user), session: Session = DB):
    """What the dashboard's run page and `draftyard runs show` render (app/runs/report.py)."""
    from app.runs.report import build_report

    return build_report(session, service.get_run(session, run_id))


@router.post("/{run_id}/cancel")
def cancel_run(run_id: str, user: Principal = Depends(current_user), session: Session = DB):
    run = service.cancel_run(session, user, service.get_run(session, run_id))
    return service.run_read(session, run)


@router.post("/{run_id}/retry")
def retry_run(run_id: str, user: Principal = Depends(current_user), session: Session = DB):
    run = service.retry_run(session, user, service.get_run(session, run_id))
    return service.run_read(session, run)
