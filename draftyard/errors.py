"""Typed exceptions for the API's error object (docs/API.md "Conventions"):
`{"error": {"code", "message", "param", "details"}}`, one class per HTTP status so that callers
can `except NotFound` instead of comparing numbers."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An answer of 400 or more from the draftyard API, carrying its error object."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None,
                 details: Any = None, request_id: str | None = None, body: Any = None):
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.details = details
        self.request_id = request_id
        self.body = body
        where = f" (param {param})" if param else ""
        super().__init__(f"HTTP {status} {code}: {message}{where}")

    @property
    def error(self) -> dict[str, Any]:
        """The API's error object as it came."""
        return {"code": self.code, "message": self.message, "param": self.param,
                "details": self.details}


class BadRequest(ApiError):
    """400: malformed input."""


class Unauthorized(ApiError):
    """401: no token, or a token the server does not know."""


class Forbidden(ApiError):
    """403: not yours (only the owner or an admin may do this) or admin only."""


class NotFound(ApiError):
    """404: no such resource (or another user's private one)."""


class Conflict(ApiError):
    """409: the resource's state forbids this now (cancelling a finished job...)."""


class PayloadTooLarge(ApiError):
    """413: the upload exceeds DRAFTYARD_MAX_UPLOAD_BYTES."""


class Unprocessable(ApiError):
    """422: well-formed but invalid spec; `param` names the field."""


class Unavailable(ApiError):
    """503: the database or the broker is down."""


class ServerError(ApiError):
    """Any other 5xx."""


_BY_STATUS = {400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
              413: PayloadTooLarge, 422: Unprocessable, 503: Unavailable}


def error_for(status: int, body: Any, request_id: str | None = None) -> ApiError:
    """The typed exception for an error answer; a body that is not the API's error object
    (a proxy's HTML page) still gives a readable message."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        text = body if isinstance(body, str) else repr(body)
        err = {"code": f"http_{status}", "message": text.strip()[:500] or f"HTTP {status}"}
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else ApiError)
    return cls(status, str(err.get("code") or f"http_{status}"), str(err.get("message") or ""),
               err.get("param"), err.get("details"), request_id, body)
