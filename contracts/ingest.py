"""Typed params of the `ingest` stage (one source file -> a dataset artifact)."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

# The one list of dataset formats: "auto" (each record by the format its keys show) and every
# format the ingest stage normalizes (workers/stages/ingest/formats.py NORMALIZERS, checked
# against this list when it is imported). The API's and the CLI's format choices read it.
FormatName = Literal["auto", "openai", "sharegpt", "alpaca", "openorca", "oasst", "ultrachat",
                     "magicoder", "evol_codealpaca", "prompt", "oasst_flat"]
FORMAT_CHOICES: tuple[str, ...] = get_args(FormatName)
FORMATS = tuple(f for f in FORMAT_CHOICES if f != "auto")  # the formats themselves


class IngestParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: FormatName = "auto"
    # A few bad lines are normal in public dumps; a file that is mostly bad is the wrong file.
    max_reject_share: float = Field(0.5, ge=0.0, le=1.0)
    dataset_name: str | None = Field(None, min_length=1, max_length=200)
    # Rows per Parquet row group: big enough to amortize Arrow conversion, small enough that
    # the two batches in flight stay a few tens of MB.
    batch_rows: int = Field(4096, ge=1, le=1_000_000)
