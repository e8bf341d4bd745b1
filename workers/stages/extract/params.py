"""Typed params of the extract stage. Unknown fields are refused (a typo must not silently
fall back to a default that costs a day of GPU time)."""

from __future__ import annotations

from pydantic import ValidationError

from contracts.extract import (  # noqa: F401  the models live in contracts/ (the API validates with them too)
    DEFAULT_MARGIN_BYTES,
    ExtractParams,
    VllmParams,
)
from workers.stages.common import StageError


def parse_params(raw: dict | None) -> ExtractParams:
    try:
        return ExtractParams.model_validate(raw or {})
    except ValidationError as e:
        errs = e.errors()
        first = errs[0]
        field = ".".join(str(x) for x in first["loc"])
        raise StageError("invalid_params", f"params.{field}: {first['msg']}",
                         details={"errors": [{"field": ".".join(str(x) for x in er["loc"]),
                                              "message": er["msg"]} for er in errs]}) from None
