"""Typed params of the `probe` job (a node's facts; a sleep or a failure on purpose)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ProbeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # An hour is plenty to test a queue or a cancel; a day-long sleep only holds a slot.
    sleep_s: float = Field(0.0, ge=0, le=3600)
    fail: bool = False
    steps: int = Field(10, ge=1, le=100000)
    # false: skip importing torch (no device list; the stage starts in ~0.2 s, not ~3 s)
    import_torch: bool = True
