"""Target response schemas (API.md "Targets")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app.jobs.schemas import ReadModel


class TargetSummary(ReadModel):
    """A target in `GET /v1/targets`: its chat template by hash and length, not whole (a
    listing must not carry every member's templates; issue 26 item 5)."""
    id: str
    name: str
    owner: str
    path: str
    tokenizer_path: str
    chat_template_sha256: str | None
    chat_template_chars: int | None
    chat_template_kwargs: dict[str, Any]
    architecture: str | None
    hidden_size: int | None
    num_layers: int | None
    vocab_size: int | None
    has_chat_template: bool
    created_at: datetime


class TargetRead(TargetSummary):
    """`GET /v1/targets/{id}` and the answer of `POST /v1/targets`: the template whole."""
    chat_template: str | None


class TargetList(ReadModel):
    data: list[TargetSummary]
    has_more: bool
    next_after: str | None
