"""Typed params of the extract stage. Unknown fields are refused (a typo must not silently
fall back to a default that costs a day of GPU time)."""

from __future__ import annotations

from contracts.extract import (  # noqa: F401  the models live in contracts/ (the API validates with them too)
    DEFAULT_MARGIN_BYTES,
    ExtractParams,
    VllmParams,
)
