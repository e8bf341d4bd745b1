"""X-Request-ID on every response (taken from the request when the client sent one), and the
cap on request bodies."""

from __future__ import annotations

import uuid

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.config import get_settings
from app.core.errors import error_body
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


class BodyLimitMiddleware(_HttpMiddleware):
    """Caps request bodies on the bytes that arrive, not only on Content-Length: a chunked
    upload or a 50 MB JSON body is refused without being read whole (issue 17 item 5).
    Multipart uploads get DRAFTYARD_MAX_UPLOAD_BYTES (plus room for the form's other parts),
    everything else DRAFTYARD_MAX_BODY_BYTES."""

    FORM_OVERHEAD = 1 << 20

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        s = get_settings()
        headers = dict(scope.get("headers") or [])
        ctype = headers.get(b"content-type", b"").decode("latin-1")
        if ctype.startswith("multipart/form-data"):
            cap, what = s.max_upload_bytes + self.FORM_OVERHEAD, "DRAFTYARD_MAX_UPLOAD_BYTES"
        else:
            cap, what = s.max_body_bytes, "DRAFTYARD_MAX_BODY_BYTES"
        try:
            declared = int(headers.get(b"content-length", b"0") or 0)
        except ValueError:
            declared = 0
        if declared > cap:
            resp = SafeJSONResponse(error_body("payload_too_large", BodyTooLarge(cap, what).detail,
                                               "body"), status_code=413,
                                    headers={"Connection": "close"})
            await resp(scope, receive, send)
            return
        seen = 0

        async def _receive() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > cap:
                    raise BodyTooLarge(cap, what)
            return msg

        await self.app(scope, _receive, send)
