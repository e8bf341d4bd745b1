"""/v1/webhooks: thin handlers over app.webhooks.service."""

from __future__ import annotations

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from app.core.deps import CurrentUser, PageDep, SessionDep
from app.core.reads import typed
from app.webhooks import service
from app.webhooks.schemas import DeliveryList, DeliveryRead, HookList, HookRead

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])


class WebhookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(max_length=2000, description="http(s) URL that receives a POST per event")
    events: list[str] = Field(max_length=len(service.EVENTS), description=(
        "events to send: " + ", ".join(service.EVENTS)))


@router.post("", status_code=201, response_model=HookRead)
def create_webhook(body: WebhookCreate, user: CurrentUser,
                   session: SessionDep):
    hook, secret = service.create_webhook(session, user, body.url, body.events)
    return typed(HookRead.of(hook, secret), status_code=201)


@router.get("", response_model=HookList)
def list_webhooks(page: PageDep, user: CurrentUser,
                  session: SessionDep):
    rows, more, nxt = service.list_webhooks(session, user, page)
    return typed(HookList(data=[HookRead.of(h) for h in rows], has_more=more, next_after=nxt))


@router.get("/{hook_id}", response_model=HookRead)
def get_webhook(hook_id: str, user: CurrentUser, session: SessionDep):
    return typed(HookRead.of(service.get_webhook(session, user, hook_id)))


@router.delete("/{hook_id}", status_code=204)
def delete_webhook(hook_id: str, user: CurrentUser, session: SessionDep):
    service.delete_webhook(session, user, hook_id)
    return Response(status_code=204)


@router.get("/{hook_id}/deliveries", response_model=DeliveryList)
def deliveries(*, hook_id: str, status: str | None = Query(None, pattern="^(pending|delivered|failed)$"),
               page: PageDep, user: CurrentUser,
               session: SessionDep):
    hook = service.get_webhook(session, user, hook_id)
    rows, more, nxt = service.list_deliveries(session, hook, page, status)
    # Payloads are written as the owner reads the job (app/webhooks/service._job_data); shown
    # again to the reader, for rows written before that.
    return typed(DeliveryList(data=[DeliveryRead.of(d) for d in rows], has_more=more,
                              next_after=nxt), user=user)
