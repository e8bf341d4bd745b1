"""Webhooks per user and their outbox of deliveries (app/webhooks)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.models.base import Base, utcnow


class Webhook(Base):
    __tablename__ = "webhooks"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list] = mapped_column(default=list)
    # Kept in clear: HMAC signing needs the secret itself (it is shown to the user once).
    secret: Mapped[str] = mapped_column(String(80))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebhookDelivery(Base):
    """The outbox: one row per (event, webhook), written in the transaction that changed the
    job, so a committed state change always has its deliveries and a rolled-back one none."""

    __tablename__ = "webhook_deliveries"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"),
                                    primary_key=True, autoincrement=True)
    webhook_id: Mapped[str] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"))
    event_id: Mapped[str] = mapped_column(String(40))
    event: Mapped[str] = mapped_column(String(40))
    body: Mapped[str] = mapped_column(Text)  # the exact bytes that are signed and sent
    status: Mapped[str] = mapped_column(String(20), default="pending")  # pending|delivered|failed
    attempts: Mapped[int] = mapped_column(default=0)
    next_at: Mapped[datetime] = mapped_column(default=utcnow)
    # A sender's claim: another sender skips the row until then (a sender that died mid-send
    # leaves it to be sent again: at least once).
    locked_until: Mapped[datetime | None] = mapped_column(default=None)
    last_status_code: Mapped[int | None] = mapped_column(default=None)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(default=None)

    __table_args__ = (UniqueConstraint("webhook_id", "event_id"),
                      Index("ix_webhook_deliveries_due", "status", "next_at"),
                      Index("ix_webhook_deliveries_hook", "webhook_id", "id"))
