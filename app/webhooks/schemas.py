"""Webhook response schemas (docs/API.md "Webhooks")."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from pydantic import Field

from app.core.reads import ReadModel
from app.models import Webhook, WebhookDelivery


class HookRead(ReadModel):
    id: str
    url: str
    events: list[str]
    owner: str
    created_at: datetime
    secret: str | None = Field(None, description="the signing secret: only in the answer of "
                                                 "POST /v1/webhooks (shown once)")

    @classmethod
    def of(cls, h: Webhook, secret: str | None = None) -> HookRead:
        once = {} if secret is None else {"secret": secret}  # absent, not null, when not shown
        return cls(id=h.id, url=h.url, events=h.events, owner=h.owner_id,
                   created_at=h.created_at, **once)


class HookList(ReadModel):
    data: list[HookRead]
    has_more: bool
    next_after: str | None


class DeliveryRead(ReadModel):
    id: str
    event_id: str
    event: str
    status: str  # pending | delivered | failed
    attempts: int
    next_at: datetime | None  # pending only
    last_status_code: int | None
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None
    payload: dict[str, Any]  # the event as sent (the signed body)

    @classmethod
    def of(cls, d: WebhookDelivery) -> DeliveryRead:
        return cls(id=str(d.id), event_id=d.event_id, event=d.event, status=d.status,
                   attempts=d.attempts, next_at=d.next_at if d.status == "pending" else None,
                   last_status_code=d.last_status_code, last_error=d.last_error,
                   created_at=d.created_at, delivered_at=d.delivered_at,
                   payload=json.loads(d.body))


class DeliveryList(ReadModel):
    data: list[DeliveryRead]
    has_more: bool
    next_after: str | None
