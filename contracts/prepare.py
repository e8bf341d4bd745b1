"""Typed params of the prepare stage. Unknown fields are refused: a typo in `train_on` or
`chat_template_kwargs` must fail the job, not silently train on the wrong tokens."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class PrepareParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seq_length: int = Field(2048, ge=1)
    # truncate: keep the first seq_length tokens (a cut turn keeps its first part);
    # drop: reject records longer than seq_length.
    length_policy: Literal["truncate", "drop"] = "truncate"
    # rows with fewer trained tokens (after truncation) are rejected; >= 1 so that no row
    # has an empty mask.
    min_valid_tokens: int = Field(1, ge=1)
    train_on: Literal["all", "last"] = "all"
    chat_template: str | None = None           # override text; None: the target's
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)  # merged over the target's
    draft_vocab_size: int | None = Field(None, ge=1)
    num_workers: int | None = Field(None, ge=1)  # None: the usable cores
    # the job fails when more than this share of the records is rejected
    max_reject_share: float = Field(0.5, ge=0, le=1)
    allow_template_mismatch: bool = False
    # auto: `{% generation %}` blocks where the template has them, else anchors; anchors:
    # always anchors (the generation-prompt header is then never trained, even when a
    # training template's generation block starts before the end of that header).
    mask_method: Literal["auto", "anchors"] = "auto"
    # A dataset from the generate stage (meta.generation, same template setup) with its
    # token_ids.parquet: rows of generated turns are the target's prompt + completion ids
    # exactly (workers/stages/prepare/tokenrows.py); false re-renders and re-tokenizes the
    # text, as for other datasets.
    use_token_ids: bool = True
    records_per_task: int = Field(256, ge=1)   # records per worker task (batch-encoded together)
    max_samples: int | None = Field(None, ge=1)  # the first max_samples records
