from __future__ import annotations

from fastapi import APIRouter, Header
from pydantic import BaseModel, ConfigDict, Field

from app.core.deps import CurrentUser, PageDep, SessionDep
from app.core.idempotency import idempotent
from app.core.reads import body_of, typed
from app.targets import service
from app.targets.schemas import TargetList, TargetRead, TargetSummary
from contracts.bounds import JsonObject, ServerPath

# A real chat template is under 64 KB (the longest in /work/shared/fixtures and on the Hub's
# large models are ~10-20 KB); four times that bounds what one member stores for everyone
#. Paths: contracts/bounds.ServerPath.
MAX_CHAT_TEMPLATE_CHARS = 262_144

router = APIRouter(prefix="/v1/targets", tags=["targets"])


class TargetCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    path: ServerPath
    tokenizer_path: ServerPath | None = None
    chat_template: str | None = Field(None, max_length=MAX_CHAT_TEMPLATE_CHARS, description=(
        f"Jinja chat template, at most {MAX_CHAT_TEMPLATE_CHARS:,} characters"))
    chat_template_kwargs: JsonObject | None = None


@router.post("", status_code=201, response_model=TargetRead)
def create_target(body: TargetCreate, user: CurrentUser,
                  session: SessionDep, idempotency_key: str | None = Header(None)):
    return idempotent(session, user, idempotency_key, body.model_dump(),
                      lambda: body_of(TargetRead.of(service.create_target(session, user, body)),
                                      user))


@router.get("", response_model=TargetList)
def list_targets(page: PageDep, user: CurrentUser,
                 session: SessionDep):
    rows, more, nxt = service.list_targets(session, page)
    return typed(TargetList(data=[TargetSummary.of(t) for t in rows], has_more=more,
                            next_after=nxt), user=user)


@router.get("/{target_id}", response_model=TargetRead)
def get_target(target_id: str, user: CurrentUser, session: SessionDep):
    return typed(TargetRead.of(service.get_target(session, target_id)), user=user)
