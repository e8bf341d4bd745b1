"""X-Request-ID on every response (taken from the request when the client sent one), the
caps on request bodies, and the access log's redaction of tokens in URLs."""

from __future__ import annotations

import logging
import re
import uuid

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.auth import TOKEN_PREFIX, bearer_principal
from app.core.config import get_settings
from app.core.errors import ApiError, error_body
from app.core.jsonresp import SafeJSONResponse


class _HttpMiddleware:
    """A pure ASGI middleware that acts on HTTP requests only (lifespan passes through)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class RequestIdMiddleware(_HttpMiddleware):
    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        rid = None
        for k, v in scope.get("headers", []):
            if k == b"x-request-id":
                rid = v.decode("latin-1")[:128]
                break
        rid = rid or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid

        async def _send(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                msg.setdefault("headers", [])
                msg["headers"] = list(msg["headers"]) + [(b"x-request-id", rid.encode())]
            await send(msg)

        await self.app(scope, receive, _send)


class BodyTooLarge(StarletteHTTPException):
    """Raised from `receive` once a body streams past its cap; the error handler renders it
    as a 413 with the error object (a StarletteHTTPException, so FastAPI's body reader lets it
    through instead of calling it a parse error)."""

    def __init__(self, cap: int, what: str):
        super().__init__(413, f"the request body exceeds {what} ({cap} bytes)")


class NotAuthenticated(StarletteHTTPException):
    """Raised from `receive` once a request without a valid token streams past
    UNAUTHENTICATED_BODY_BYTES: rendered as the 401 the route would answer."""

    def __init__(self, code: str, message: str):
        super().__init__(401, message)
        self.code = code


# What a request without a valid token may make the API read before its token is looked at:
# a small body costs nothing to read (a route refuses it 401 before using it:
# app/core/auth.caller_before_body), and past this the token is checked at once.
UNAUTHENTICATED_BODY_BYTES = 64 * 1024
UPLOAD_ROUTES = {("POST", "/v1/datasets")}


async def _who(headers: dict[bytes, bytes]) -> tuple[bool, str, str]:
    """(authenticated, error code, message) from the Authorization header, as current_user
    would decide; a database that cannot be asked counts as not authenticated (the route then
    answers its 503)."""
    try:
        p = await bearer_principal(headers.get(b"authorization", b"").decode("latin-1"))
    except ApiError as e:
        return False, e.code, e.message
    except Exception:  # noqa: BLE001  the DB is down: the route's own answer follows
        return False, "unauthorized", "the token could not be checked"
    return p is not None, "", ""


class BodyLimitMiddleware(_HttpMiddleware):
    """Caps request bodies on the bytes that arrive, not only on Content-Length: a chunked
    upload or a 50 MB JSON body is refused without being read whole.

    The cap is the route's, whatever the Content-Type says: the upload route
    (POST /v1/datasets, multipart) DRAFTYARD_MAX_UPLOAD_BYTES plus room for the form's other
    parts, every other route DRAFTYARD_MAX_BODY_BYTES. And a request without a valid token
    is read no further than UNAUTHENTICATED_BODY_BYTES: past that it is answered 401 (the
    token is checked only then, so small requests pay nothing here)."""

    FORM_OVERHEAD = 1 << 20

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        s = get_settings()
        headers = dict(scope.get("headers") or [])
        ctype = headers.get(b"content-type", b"").decode("latin-1")
        if (scope.get("method"), scope.get("path")) in UPLOAD_ROUTES and \
                ctype.startswith("multipart/form-data"):
            cap, what = s.max_upload_bytes + self.FORM_OVERHEAD, "DRAFTYARD_MAX_UPLOAD_BYTES"
        else:
            cap, what = s.max_body_bytes, "DRAFTYARD_MAX_BODY_BYTES"
        try:
            declared = int(headers.get(b"content-length", b"0") or 0)
        except ValueError:
            declared = 0
        authed: bool | None = None
        if declared > UNAUTHENTICATED_BODY_BYTES:
            authed, code, message = await _who(headers)
            if not authed:
                await _refuse(scope, receive, send, 401, code, message)
                return
        if declared > cap:
            await _refuse(scope, receive, send, 413, "payload_too_large",
                          BodyTooLarge(cap, what).detail)
            return
        seen = 0

        async def _receive() -> Message:
            nonlocal seen, authed
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > UNAUTHENTICATED_BODY_BYTES and authed is None:
                    authed, code, message = await _who(headers)
                    if not authed:
                        raise NotAuthenticated(code, message)
                if seen > cap:
                    raise BodyTooLarge(cap, what)
            return msg

        await self.app(scope, _receive, send)


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, code: str,
                  message: str) -> None:
    resp = SafeJSONResponse(error_body(code, message, "body" if status == 413 else None),
                            status_code=status, headers={"Connection": "close"})
    await resp(scope, receive, send)


class RedactTokens(logging.Filter):
    """Takes credentials out of the access log (uvicorn.access): a token a client put in the
    URL (`?token=`, `access_token=`, `api_key=`..., or a `dy_...` token anywhere in the path)
    is written as `[redacted]`. Tokens belong in the Authorization header,
    which is never logged."""

    QUERY = re.compile(r"([?&](?:access_token|token|api_key|apikey|key|secret|password)=)"
                       r"[^&\s\"]*", re.I)
    TOKEN = re.compile(rf"{TOKEN_PREFIX}[A-Za-z0-9_-]{{16,}}")

    def redact(self, text: str) -> str:
        return self.TOKEN.sub("[redacted]", self.QUERY.sub(r"\1[redacted]", text))

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(self.redact(a) if isinstance(a, str) else a
                                for a in record.args)
        elif isinstance(record.msg, str):
            record.msg = self.redact(record.msg)
        return True
