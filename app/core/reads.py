"""Typed reads: a route declares `response_model=` (what /openapi.json shows) and returns
`typed(body)`, the body exactly as its handler built it.

Why not let FastAPI re-serialise through the model: pydantic writes a UTC datetime as `...Z`
where the API has always sent `...+00:00` (API.md), and the hot read paths skip a second
validation. tests/service/test_reads.py keeps models and bodies in step instead.
"""

from __future__ import annotations

from typing import Any

from fastapi.encoders import jsonable_encoder
from app.core.jsonresp import SafeJSONResponse


def typed(body: Any, status_code: int = 200) -> SafeJSONResponse:
    return SafeJSONResponse(jsonable_encoder(body), status_code=status_code)
