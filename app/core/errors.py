"""Domain errors that carry their HTTP status, and the one handler that renders them as
`{"error": {"code", "message", "param", "details"}}` (docs/API.md "Conventions")."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from app.core.jsonresp import SafeJSONResponse
from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import DataError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from contracts.bounds import BOUND_ERRORS

log = logging.getLogger("draftyard.api")


class ApiError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None,
                 details: Any = None, status: int | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.details = details
        if code:
            self.code = code
        if status:
            self.status = status


class BadRequest(ApiError):
    status, code = 400, "bad_request"


class Unauthorized(ApiError):
    status, code = 401, "unauthorized"


class Forbidden(ApiError):
    status, code = 403, "forbidden"


class NotFound(ApiError):
    status, code = 404, "not_found"


class Conflict(ApiError):
    status, code = 409, "conflict"


class TooLarge(ApiError):
    status, code = 413, "payload_too_large"


class Invalid(ApiError):
    status, code = 422, "invalid_spec"


class TooMany(ApiError):
    status, code = 429, "too_many_requests"


class Unavailable(ApiError):
    status, code = 503, "unavailable"


class NoSpace(ApiError):
    status, code = 507, "insufficient_storage"


class ErrorDetail(BaseModel):
    code: str
    message: str
    param: str | None = None
    details: Any = None


class ErrorBody(BaseModel):
    """The error object every 4xx/5xx carries (docs/API.md "Conventions")."""
    error: ErrorDetail


_WHY = {400: "Bad input: malformed JSON, or a free-form field past its bounds",
        401: "Missing or invalid token", 403: "Not allowed (role, owner, path outside roots)",
        404: "Not found", 409: "State conflict", 413: "Body, upload or inflated upload too large",
        422: "Well-formed but invalid (names the field)", 429: "Too many at once; try later",
        503: "Database or broker unavailable", 507: "Server storage full"}
# For `/openapi.json`: what every /v1 route may answer besides its success.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": why} for code, why in _WHY.items()}


# Raises Unauthorized when a request lacks the token its route needs (app/core/auth.py).
CallerCheck = Callable[[Request], Awaitable[None]]


def error_body(code: str, message: str, param: str | None = None, details: Any = None) -> dict:
    return {"error": {"code": code, "message": message, "param": param, "details": details}}


def _loc_to_param(loc: tuple) -> str | None:
    # Only the first part names where the value was (a field may be called `path`).
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts) or None


def _rendered(exc: ApiError) -> SafeJSONResponse:
    return SafeJSONResponse(error_body(exc.code, exc.message, exc.param, exc.details),
                            status_code=exc.status)


def _unavailable(exc: OperationalError) -> SafeJSONResponse:
    log.warning("database unavailable: %s", exc)
    return SafeJSONResponse(error_body("database_unavailable",
                                       "the database is not reachable; try again"),
                            status_code=503)


async def _caller_first(req: Request, check: CallerCheck) -> SafeJSONResponse | None:
    """The 401 (or 503) a request whose body could not be parsed gets before its 400, when
    its route needs a token it lacks (`check`: app/core/auth.caller_before_body, passed in by
    app/main.py since auth imports this module); None: go on."""
    try:
        await check(req)
    except ApiError as e:
        return _rendered(e)
    except OperationalError as e:
        return _unavailable(e)
    return None


def install_handlers(app: FastAPI, caller_check: CallerCheck) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_req: Request, exc: ApiError):
        return _rendered(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError):
        errs = exc.errors()
        bound = next((e for e in errs if e.get("type") in BOUND_ERRORS), None)
        if bound is not None:
            # A free-form field past its bounds (contracts/bounds.py): named, never stored.
            param = _loc_to_param(tuple(bound.get("loc", ())))
            code = "invalid_value" if bound["type"] == "invalid_value" else bound["type"]
            return SafeJSONResponse(error_body(code, f"{param}: {bound.get('msg')}", param),
                                  status_code=BOUND_ERRORS[bound["type"]])
        # A body that is not JSON at all is a 400; JSON of the wrong shape is a 422.
        if any(e.get("type") in ("json_invalid", "json_type") for e in errs):
            if (refused := await _caller_first(_req, caller_check)) is not None:
                return refused
            e = errs[0]
            return SafeJSONResponse(error_body("malformed_json", f"request body is not valid JSON: "
                                             f"{e.get('msg')}", None,
                                             {"position": e.get("ctx", {}).get("error")}),
                                  status_code=400)
        first = errs[0]
        param = _loc_to_param(tuple(first.get("loc", ())))
        msg = first.get("msg", "invalid")
        if first.get("type") == "extra_forbidden":
            msg = f"unknown field '{param}'"
        elif first.get("type") == "missing":
            msg = f"field '{param}' is required"
        else:
            msg = f"{param}: {msg}" if param else msg
        details = [{"param": _loc_to_param(tuple(e.get("loc", ()))), "message": e.get("msg"),
                    "type": e.get("type")} for e in errs]
        return SafeJSONResponse(error_body("invalid_spec", msg, param, details), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(req: Request, exc: StarletteHTTPException):
        # FastAPI's "error parsing the body" (not UTF-8, a broken form): the token first too.
        if exc.status_code == 400 and (refused := await _caller_first(req, caller_check)) is not None:
            return refused
        code = getattr(exc, "code", None) or {
            404: "not_found", 405: "method_not_allowed", 401: "unauthorized",
            413: "payload_too_large"}.get(exc.status_code, "http_error")
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            # RFC 9110 15.5.6: `Allow` lists every method of the path. Starlette names only
            # the first route that matched it (GET and POST /v1/jobs are two routes).
            allow = [m for m in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
                     if any(r.matches({**req.scope, "method": m})[0] == Match.FULL
                            for r in req.app.router.routes)]
            headers["Allow"] = ", ".join(allow)
        return SafeJSONResponse(error_body(code, str(exc.detail)), status_code=exc.status_code,
                              headers=headers or None)

    @app.exception_handler(OperationalError)
    async def _db_down(_req: Request, exc: OperationalError):
        return _unavailable(exc)

    @app.exception_handler(DataError)
    async def _bad_value(_req: Request, exc: DataError):
        # A value the database cannot store (a NUL character in text or JSON, an integer out
        # of range): bad input, and the transaction was rolled back, so nothing is written.
        why = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0][:300]
        return SafeJSONResponse(error_body("invalid_value", f"a value cannot be stored: {why}"),
                              status_code=422)

    @app.exception_handler(ValidationError)
    async def _late_validation(_req: Request, exc: ValidationError):
        # A model built by a service from request values (a job a dataset route creates):
        # still the client's input, so a 422 naming the field, not a 500.
        log.warning("validation after the edge: %s", exc)
        first = exc.errors()[0]
        param = _loc_to_param(tuple(first.get("loc", ())))
        return SafeJSONResponse(error_body("invalid_spec", f"{param}: {first.get('msg')}", param),
                              status_code=BOUND_ERRORS.get(str(first.get("type")), 422))

    @app.exception_handler(UnicodeEncodeError)
    async def _unencodable(_req: Request, exc: UnicodeEncodeError):
        # A lone surrogate ("\\ud800") in a typed string field: valid JSON, but neither the
        # database driver nor orjson can encode it. The transaction was rolled back.
        return SafeJSONResponse(error_body("invalid_value", "a string in the request is not valid "
                                         "Unicode (a lone surrogate)"), status_code=422)

    @app.exception_handler(Exception)
    async def _unexpected(_req: Request, exc: Exception):
        # Never a traceback to the user; the log keeps it with the request id.
        log.exception("unhandled error")
        return SafeJSONResponse(error_body("internal_error", "an unexpected error occurred; it "
                                         "was logged with this request's X-Request-ID"),
                              status_code=500)
