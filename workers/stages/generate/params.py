"""Typed params of the `generate` stage; unknown fields are refused so a typo is not ignored."""

from __future__ import annotations

from pydantic import ValidationError

from contracts.generate import (  # noqa: F401  the models live in contracts/ (the API validates with them too)
    GenerateParams,
    VllmParams,
)
from workers.stages.common import StageError


def parse_params(raw: dict | None) -> GenerateParams:
    """Validate params early; the error names the offending field."""
    try:
        return GenerateParams.model_validate(raw or {})
    except ValidationError as e:
        problems = [{"field": ".".join(str(p) for p in err["loc"]) or "params",
                     "message": err["msg"]} for err in e.errors()]
        first = problems[0]
        raise StageError("invalid_params", f"params.{first['field']}: {first['message']}",
                         problems) from None
