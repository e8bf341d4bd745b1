"""Typed params of the `ingest` stage (one source file -> a dataset artifact)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

FormatName = Literal["auto", "openai", "sharegpt", "alpaca", "openorca", "oasst", "ultrachat",
                     "magicoder", "evol_codealpaca", "prompt", "oasst_flat"]


class IngestParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: FormatName = "auto"
    # A few bad lines are normal in public dumps; a file that is mostly bad is the wrong file.
    max_reject_share: float = Field(0.5, ge=0.0, le=1.0)
    dataset_name: str | None = Field(None, min_length=1, max_length=200)
    # Rows per Parquet row group: big enough to amortize Arrow conversion, small enough that
    # the two batches in flight stay a few tens of MB.
    batch_rows: int = Field(4096, ge=1, le=1_000_000)
