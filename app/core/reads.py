"""Typed reads: a route answers with its read model (`typed(JobRead(...))`), so a body that
does not fit the model it declares is an error here, not a surprise for a client.

Built and checked by pydantic, rendered by the API's one JSON encoder (SafeJSONResponse:
orjson, which writes a datetime as `...+00:00` as docs/API.md always has, and falls back for stored
values orjson refuses). Rendering takes the validated values as they are (`plain`), not
pydantic's serializer: a free-form field (inputs, params, metrics) is passed through whole,
however deep, and a model writes exactly the keys that were set (a stage's progress keeps
its own keys, no `null`s added)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from app.core.auth import Principal
from app.core.jsonresp import SafeJSONResponse
from app.core.paths import shown


class ReadModel(BaseModel):
    """A response body (documentation in /openapi.json). `forbid`: a key the model does not
    document is an error."""

    model_config = ConfigDict(extra="forbid")


# Values `plain` returns as they are without looking further: most fields of a read.
_ATOMS = frozenset({str, int, float, bool, type(None), datetime})


def plain(v: Any) -> Any:
    """A model as the plain values it holds: its set fields in declared order, then extras."""
    if isinstance(v, BaseModel):
        set_ = v.model_fields_set
        out = {k: x if type(x := getattr(v, k)) in _ATOMS else plain(x)
               for k in type(v).model_fields if k in set_}
        out.update({k: plain(x) for k, x in (v.__pydantic_extra__ or {}).items()})
        return out
    if isinstance(v, list) and v and isinstance(v[0], BaseModel):
        return [plain(x) for x in v]
    if isinstance(v, dict) and v and isinstance(next(iter(v.values())), BaseModel):
        return {k: plain(x) for k, x in v.items()}
    return v


def body_of(model: BaseModel, user: Principal | None = None) -> Any:
    """The body of `model` as `user` may see it (a member: server folders as labels,
    app/core/paths.shown); None: as it is."""
    body = plain(model)
    return shown(body, user) if user is not None else body


def typed(model: BaseModel, status_code: int = 200, headers: dict[str, str] | None = None,
          user: Principal | None = None) -> SafeJSONResponse:
    return SafeJSONResponse(body_of(model, user), status_code=status_code, headers=headers)
