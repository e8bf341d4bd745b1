from __future__ import annotations

from fastapi import APIRouter, Header

from app.core.db import unit_of_work
from app.core.deps import CurrentUser, PageDep, SessionDep
from app.core.idempotency import idempotent, replay
from app.core.paths import shown
from app.core.reads import typed
from app.plans.service import plan_or_refuse
from app.runs import service
from app.runs.names import with_ids
from app.runs.report import build_report
from app.runs.schemas import RunCreate, RunCreated, RunList, RunRead
from app.storage.reserve import check_quota

router = APIRouter(prefix="/v1/runs", tags=["runs"])


@router.post("", status_code=201, response_model=RunCreated)
def create_run(body: RunCreate, user: CurrentUser, session: SessionDep,
               idempotency_key: str | None = Header(None)):
    request = body.model_dump(mode="json")
    if idempotency_key and (done := replay(user, idempotency_key, request)) is not None:
        return done  # answered before: neither the plan nor the run again
    service.check_params(body)  # the body's own faults first, before any name is looked up
    body = with_ids(body, user)  # names where ids go
    chain = service.check_params(body)
    with unit_of_work(read_only=True) as s:  # before the plan's seconds (create_job again)
        check_quota(s, user.id, user.name, "a new run")
    # Before the request's transaction begins (the session opens it on first use): the plan
    # takes seconds and reads in its own short transaction.
    plan = plan_or_refuse(body)

    def make():
        run = service.create_run(session, user, body, chain)
        session.flush()
        return RunCreated(**dict(service.run_model(session, run)), plan=plan)
    return idempotent(session, user, idempotency_key, request, make)


@router.get("", response_model=RunList)
def list_runs(page: PageDep, user: CurrentUser,
              session: SessionDep):
    rows, more, nxt = service.list_runs(session, page)
    return typed(RunList(data=service.run_models(session, rows), has_more=more, next_after=nxt),
                 user=user)


@router.get("/{run_id}", response_model=RunRead)
def get_run(run_id: str, user: CurrentUser, session: SessionDep):
    return typed(service.run_model(session, service.get_run(session, run_id)), user=user)


@router.get("/{run_id}/report")
def get_run_report(run_id: str, user: CurrentUser, session: SessionDep):
    """What the dashboard's run page and `draftyard runs show` render (app/runs/report.py)."""
    return shown(build_report(session, service.get_run(session, run_id)), user)


@router.post("/{run_id}/cancel", response_model=RunRead)
def cancel_run(run_id: str, user: CurrentUser, session: SessionDep):
    run = service.cancel_run(session, user, service.get_run(session, run_id))
    return typed(service.run_model(session, run), user=user)


@router.post("/{run_id}/retry", response_model=RunRead)
def retry_run(run_id: str, user: CurrentUser, session: SessionDep):
    run = service.retry_run(session, user, service.get_run(session, run_id))
    return typed(service.run_model(session, run), user=user)
