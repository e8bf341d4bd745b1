from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import Response

from app.core.jsonresp import SafeJSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from app.core.broker import ping_broker
from app.core.db import get_engine
from app.core.deps import CurrentUser
from app.core.errors import error_body
from app.core.metrics import refresh

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz():
    return {"status": "ok"}


@router.get("/readyz")
async def readyz():
    def check():
        problems = {}
        try:
            with get_engine().connect() as c:
                c.execute(text("SELECT 1"))
        except Exception as e:  # noqa: BLE001
            problems["database"] = str(e).splitlines()[0][:200]
        try:
            ping_broker()
        except Exception as e:  # noqa: BLE001
            problems["broker"] = str(e).splitlines()[0][:200]
        return problems
    problems = await asyncio.to_thread(check)
    if problems:
        return SafeJSONResponse(error_body("not_ready", "dependencies unreachable: " +
                                         ", ".join(problems), None, problems), status_code=503)
    return {"status": "ready"}


@router.get("/metrics")
def metrics(user: CurrentUser):
    refresh()
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
