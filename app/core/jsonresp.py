"""The API's JSON response: orjson (fast), falling back to the standard library for a stored
value orjson refuses (nested past 255 levels, an integer past 64 bits, a lone surrogate),
so a listing can never become a 500 for everyone because of one row. New
values are bounded at the edge (contracts/bounds.py); this covers rows stored before that."""

from __future__ import annotations

import json
import logging
from typing import Any

import orjson
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

log = logging.getLogger("draftyard.api")


def _placeholder(_o: Any) -> str:
    return "<unrenderable>"


class SafeJSONResponse(JSONResponse):
    """orjson's rendering (as FastAPI's ORJSONResponse did; that class is deprecated and
    warned at every server start) with the fallbacks below."""

    def render(self, content: Any) -> bytes:
        return api_json(content)


def api_json(content: Any) -> bytes:
    """`content` as the API writes it (the bodies of responses and of webhook events)."""
    try:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS
                            | orjson.OPT_SERIALIZE_NUMPY)
    except (orjson.JSONEncodeError, TypeError):
        pass
    log.warning("a response needed the slow JSON encoder (a stored value orjson refuses)")
    try:
        return json.dumps(jsonable_encoder(content), ensure_ascii=True,
                          default=_placeholder).encode()
    except (RecursionError, ValueError):
        # Deeper than even the standard library renders: show the shape, not a 500.
        return json.dumps(_shallow(content), ensure_ascii=True, default=str).encode()


def _shallow(v: Any, depth: int = 0) -> Any:
    if depth > 64:
        return "<too deep to render>"
    if isinstance(v, dict):
        return {str(k): _shallow(x, depth + 1) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_shallow(x, depth + 1) for x in v]
    return v
