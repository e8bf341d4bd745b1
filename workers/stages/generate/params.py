"""Typed params of the `generate` stage; unknown fields are refused so a typo is not ignored."""

from __future__ import annotations

from contracts.generate import (  # noqa: F401  the models live in contracts/ (the API validates with them too)
    GenerateParams,
    VllmParams,
)
