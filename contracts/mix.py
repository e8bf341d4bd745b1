"""Typed params of the `mix` stage (datasets -> one dataset: weights, caps, dedupe, seed)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class MixParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dedupe: bool = True
    seed: int = Field(0, ge=0)  # numpy SeedSequence entropy must be non-negative
    max_records: int | None = Field(None, ge=1)
