"""Bounds on the free-form JSON a client may store (job inputs and params, run stages, chat
template kwargs): checked at the edge, before anything is written, because a stored value that
cannot be rendered again breaks every listing that shows it (JSON nested ~250
deep was stored, and orjson, which refuses more than 255 levels, made `GET /v1/jobs` a 500 for
everyone).

`JsonObject` is the type to declare such a field with: a violation is a 400 (`json_too_deep`,
`json_too_large`) or a 422 (`invalid_value`: an integer past 64 bits, a lone surrogate or a NUL
that neither orjson nor PostgreSQL can hold), naming the field (app/core/errors.py maps them)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

# Deep enough for any real spec (a run's stages are 3-4 levels), far below orjson's 255.
MAX_DEPTH = 32
# Bytes of one free-form field, counted as its keys and strings plus 8 per other scalar; a
# chat template's kwargs or a stage's params are a few hundred bytes.
MAX_BYTES = 256 * 1024
INT64 = (-(2**63), 2**64 - 1)  # orjson writes unsigned 64-bit too

BOUND_ERRORS = {"json_too_deep": 400, "json_too_large": 400, "invalid_value": 422}


def _bad_str(s: str) -> str | None:
    if "\x00" in s:
        return "contains a NUL character"
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not valid Unicode)"
    return None


def check_json(value: Any, *, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES) -> Any:
    """Walk `value` (iteratively: a deep value must not blow the stack here either)."""
    size = 0
    stack: list[tuple[Any, int, str]] = [(value, 1, "")]
    while stack:
        v, depth, where = stack.pop()
        at = f" at {where}" if where else ""
        if isinstance(v, dict | list):
            if depth > max_depth:
                raise PydanticCustomError("json_too_deep", "nested deeper than {max} levels{at}",
                                          {"max": max_depth, "at": at})
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for k, x in items:
                if isinstance(k, str):
                    size += len(k)
                    if why := _bad_str(k):
                        raise PydanticCustomError("invalid_value", "a key {why}{at}",
                                                  {"why": why, "at": at})
                stack.append((x, depth + 1, f"{where}.{k}" if where else str(k)))
        elif isinstance(v, str):
            size += len(v)
            if why := _bad_str(v):
                raise PydanticCustomError("invalid_value", "a string {why}{at}",
                                          {"why": why, "at": at})
        else:
            size += 8
            if isinstance(v, int) and not isinstance(v, bool) and not INT64[0] <= v <= INT64[1]:
                raise PydanticCustomError("invalid_value",
                                          "an integer beyond 64 bits{at}", {"at": at})
        if size > max_bytes:
            raise PydanticCustomError("json_too_large", "larger than {max} bytes",
                                      {"max": max_bytes})
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(check_json)]
JsonValue = Annotated[Any, AfterValidator(check_json)]


# A path a client names (a model folder, a data file). The file system refuses a name past
# NAME_MAX or a path past PATH_MAX with ENAMETOOLONG, which `Path.resolve()` raised as a 500
# before this bound; refused here as a 422 naming the field instead. Bytes, not characters:
# the limits are on the encoded name.
PATH_MAX_BYTES = 4096
NAME_MAX_BYTES = 255


def check_path(value: str) -> str:
    raw = value.encode("utf-8", "surrogatepass")
    if len(raw) > PATH_MAX_BYTES:
        raise PydanticCustomError("path_too_long", "longer than {max} bytes",
                                  {"max": PATH_MAX_BYTES})
    if any(len(part) > NAME_MAX_BYTES for part in raw.split(b"/")):
        raise PydanticCustomError("path_too_long", "a folder or file name in it is longer "
                                  "than {max} bytes", {"max": NAME_MAX_BYTES})
    return value


ServerPath = Annotated[str, Field(max_length=PATH_MAX_BYTES),
                       AfterValidator(check_path)]
