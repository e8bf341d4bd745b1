"""Target response schemas (API.md "Targets")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app.jobs.schemas import ReadModel


class TargetRead(ReadModel):
    id: str
    name: str
    owner: str
    path: str
    tokenizer_path: str
    chat_template: str | None
    chat_template_kwargs: dict[str, Any]
    architecture: str | None
    hidden_size: int | None
    num_layers: int | None
    vocab_size: int | None
    has_chat_template: bool
    created_at: datetime


class TargetList(ReadModel):
    data: list[TargetRead]
    has_more: bool
    next_after: str | None
