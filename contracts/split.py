"""Typed params of the `split` stage: one dataset -> a training part and a held-out part.

A run without an evaluation dataset holds out a seeded share of its dataset before any stage
consumes it: generate, prepare and train see only the `train` output, evaluate only
the `held_out` one. The held-out count is `round(share * records)` clamped to
[min_records, max_records] (defaults: 2%, at least 32, at most 500), and never more than half
the records, so training keeps the larger part of a small dataset.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_SHARE = 0.02
DEFAULT_MIN = 32
DEFAULT_MAX = 500


class SplitParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int = Field(0, ge=0)  # which records are held out; the run's seed
    share: float = Field(DEFAULT_SHARE, gt=0.0, lt=1.0)
    min_records: int = Field(DEFAULT_MIN, ge=1, le=1_000_000)
    max_records: int = Field(DEFAULT_MAX, ge=1, le=1_000_000)

    @model_validator(mode="after")
    def _ordered(self) -> "SplitParams":
        if self.min_records > self.max_records:
            raise ValueError(f"min_records {self.min_records} exceeds max_records "
                             f"{self.max_records}")
        return self


def held_out_count(records: int, p: SplitParams) -> int:
    """How many of `records` are held out (0 when fewer than 2: nothing can be spared)."""
    if records < 2:
        return 0
    n = min(max(round(p.share * records), p.min_records), p.max_records)
    return max(1, min(n, records // 2))
