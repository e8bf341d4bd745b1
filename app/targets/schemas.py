"""Target response schemas (API.md "Targets")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app.core.reads import ReadModel
from app.models import Target


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

    @classmethod
    def of(cls, t: Target) -> TargetRead:
        return cls(id=t.id, name=t.name, owner=t.owner_id, path=t.path,
                   tokenizer_path=t.tokenizer_path, chat_template=t.chat_template,
                   chat_template_kwargs=t.chat_template_kwargs, architecture=t.architecture,
                   hidden_size=t.hidden_size, num_layers=t.num_layers, vocab_size=t.vocab_size,
                   has_chat_template=t.has_chat_template, created_at=t.created_at)


class TargetList(ReadModel):
    data: list[TargetRead]
    has_more: bool
    next_after: str | None
