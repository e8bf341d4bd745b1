from __future__ import annotations

from fastapi import APIRouter, Header
from pydantic import BaseModel, ConfigDict, Field

from app.core.deps import CurrentUser, PageDep, SessionDep
from app.core.idempotency import idempotent
from app.core.reads import typed
from app.targets import service
from app.targets.schemas import TargetList, TargetRead
from contracts.bounds import JsonObject

router = APIRouter(prefix="/v1/targets", tags=["targets"])


class TargetCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    path: str
    tokenizer_path: str | None = None
    chat_template: str | None = None
    chat_template_kwargs: JsonObject | None = None


@router.post("", status_code=201, response_model=TargetRead)
def create_target(body: TargetCreate, user: CurrentUser,
                  session: SessionDep, idempotency_key: str | None = Header(None)):
    return idempotent(session, user, idempotency_key, body.model_dump(),
                      lambda: TargetRead.of(service.create_target(session, user, body)))


@router.get("", response_model=TargetList)
def list_targets(page: PageDep, user: CurrentUser,
                 session: SessionDep):
    rows, more, nxt = service.list_targets(session, page)
    return typed(TargetList(data=[TargetRead.of(t) for t in rows], has_more=more,
                            next_after=nxt))


@router.get("/{target_id}", response_model=TargetRead)
def get_target(target_id: str, user: CurrentUser, session: SessionDep):
    return typed(TargetRead.of(service.get_target(session, target_id)))
