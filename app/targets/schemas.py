"""Target response schemas (docs/API.md "Targets")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app.core.reads import ReadModel
from app.models import Target


class TargetSummary(ReadModel):
    """A target in `GET /v1/targets`: its chat template by hash and length, not whole (a
    listing must not carry every member's templates)."""
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

    @classmethod
    def of(cls, t: Target) -> TargetSummary:
        return cls(id=t.id, name=t.name, owner=t.owner_id, path=t.path,
                   tokenizer_path=t.tokenizer_path, chat_template_sha256=t.chat_template_sha256,
                   chat_template_chars=t.chat_template_chars,
                   chat_template_kwargs=t.chat_template_kwargs, architecture=t.architecture,
                   hidden_size=t.hidden_size, num_layers=t.num_layers, vocab_size=t.vocab_size,
                   has_chat_template=t.has_chat_template, created_at=t.created_at)


class TargetRead(TargetSummary):
    """`GET /v1/targets/{id}` and the answer of `POST /v1/targets`: the template whole."""
    chat_template: str | None

    @classmethod
    def of(cls, t: Target) -> TargetRead:
        return cls(**dict(TargetSummary.of(t)), chat_template=t.chat_template)


class TargetList(ReadModel):
    data: list[TargetSummary]
    has_more: bool
    next_after: str | None
