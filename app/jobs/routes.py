"""/v1/jobs: thin handlers over app.jobs.service."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from app.core.auth import Principal
from app.core.db import unit_of_work
from app.core.deps import CurrentUser, PageDep, SessionDep
from app.core.idempotency import idempotent
from app.core.jsonresp import SafeJSONResponse
from app.core.paths import hider, shown
from app.core.reads import typed
from app.jobs import logs, service
from app.jobs.lifecycle import submitted
from app.jobs.params import validate_params
from app.jobs.render import job_model, job_models, read_job
from app.jobs.schemas import JobCreate, JobList, JobRead, PreemptibleUpdate, PriorityUpdate
from app.jobs.states import TERMINAL

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.post("", status_code=201, response_model=JobRead)
async def create_job(body: JobCreate, user: CurrentUser,
                     idempotency_key: str | None = Header(None)):
    # The submit every job starts with: one hop to the thread pool for the transaction, the
    # placement and the commit (a sync route with a sync session dependency costs three).
    def submit():
        with unit_of_work() as session:
            out = idempotent(session, user, idempotency_key,
                             body.model_dump(mode="json") if idempotency_key else None,
                             lambda: job_model(service.create_job(
                                 session, user, body, validate_params=validate_params)))
            submitted(session)  # placed by the commit that creates it, when the scheduler is free
        return out
    return await run_in_threadpool(submit)


@router.get("", response_model=JobList)
def list_jobs(*, status: str | None = None, type: str | None = None, owner: str | None = None,  # noqa: A002
              run_id: str | None = None, page: PageDep,
              user: CurrentUser, session: SessionDep):
    rows, more, nxt = service.list_jobs(session, page, status=status, type_=type, owner=owner,
                                        run_id=run_id)
    return typed(JobList(data=job_models(session, rows), has_more=more, next_after=nxt), user=user)


@router.get("/{job_id}", response_model=JobRead)
async def get_job(job_id: str, user: CurrentUser):
    # The route every client polls: one hop to the thread pool for the whole read (a sync
    # route with a sync session dependency costs several hops per request).
    return typed(await run_in_threadpool(read_job, job_id), headers={"Cache-Control": "no-store"},
                 user=user)


@router.post("/{job_id}/cancel", response_model=JobRead)
def cancel_job(job_id: str, user: CurrentUser, session: SessionDep):
    return typed(job_model(service.cancel_job(session, user, service.get_job(session, job_id))), user=user)


@router.post("/{job_id}/retry", response_model=JobRead)
def retry_job(job_id: str, user: CurrentUser, session: SessionDep):
    return typed(job_model(service.retry_job(session, user, service.get_job(session, job_id))), user=user)


@router.post("/{job_id}/priority", response_model=JobRead)
def set_priority(job_id: str, body: PriorityUpdate, user: CurrentUser,
                 session: SessionDep):
    return typed(job_model(service.set_priority(session, user, service.get_job(session, job_id),
                                               body.priority)), user=user)


@router.post("/{job_id}/preemptible", response_model=JobRead)
def set_preemptible(job_id: str, body: PreemptibleUpdate, user: CurrentUser,
                    session: SessionDep):
    return typed(job_model(service.set_preemptible(session, user, service.get_job(session, job_id),
                                                  body.preemptible)), user=user)


@router.post("/{job_id}/hold", response_model=JobRead)
def hold(job_id: str, user: CurrentUser, session: SessionDep):
    return typed(job_model(service.set_hold(session, user, service.get_job(session, job_id), True)),
                 user=user)


@router.post("/{job_id}/release", response_model=JobRead)
def release(job_id: str, user: CurrentUser, session: SessionDep):
    return typed(job_model(service.set_hold(session, user, service.get_job(session, job_id),
                                           False)), user=user)


def _event_dict(ev) -> dict:
    return {"seq": ev.id, "at": ev.at, "kind": ev.kind, "data": ev.data}


@router.get("/{job_id}/events")
def job_events(*, job_id: str, request: Request, after_seq: int = Query(0, ge=0),
               limit: int = Query(1000, ge=1, le=10000),
               last_event_id: str | None = Header(None),
               user: CurrentUser, session: SessionDep):
    service.get_job(session, job_id)
    if "text/event-stream" not in request.headers.get("accept", ""):
        return SafeJSONResponse({"data": shown([_event_dict(e) for e in
                                              service.events(session, job_id, after_seq, limit)],
                                             user)})
    start = after_seq
    if last_event_id and last_event_id.isdigit():
        start = max(start, int(last_event_id))
    return EventSourceResponse(_stream_events(job_id, start, request, user), ping=15)


async def _stream_events(job_id: str, after: int, request: Request, user: Principal):
    import orjson

    hide = hider(user)
    while True:
        def poll(after: int = after):  # bound now: the loop moves `after` on
            with unit_of_work(read_only=True) as s:
                evs = service.events(s, job_id, after, 500)
                done = service.get_job(s, job_id).status in TERMINAL
                return hide([_event_dict(e) for e in evs]), done
        evs, done = await asyncio.to_thread(poll)
        for e in evs:
            after = e["seq"]
            yield {"id": str(e["seq"]), "event": e["kind"],
                   "data": orjson.dumps(e, default=str).decode()}
        if done and not evs:
            return
        if await request.is_disconnected():
            return
        await asyncio.sleep(0.3)


@router.get("/{job_id}/logs")
def job_logs(*, job_id: str, request: Request, tail: int | None = Query(None, ge=1, le=100000),
             follow: bool = False, user: CurrentUser, session: SessionDep):
    service.get_job(session, job_id)
    if not follow:
        return PlainTextResponse(shown(logs.read_tail(job_id, tail), user))
    hide = hider(user)
    return StreamingResponse((hide(chunk) async for chunk in logs.follow(job_id, tail, request)),
                             media_type="text/plain")


@router.get("/{job_id}/metrics")
def job_metrics(job_id: str, user: CurrentUser, session: SessionDep):
    service.get_job(session, job_id)
    return SafeJSONResponse(service.metrics(session, job_id))
