"""The FastAPI app factory."""

from __future__ import annotations

import logging
import threading
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app.artifacts.routes import router as artifacts
from app.cluster.routes import router as cluster
from app.cluster.shared import announce
from app.core.auth import caller_before_body
from app.core.config import get_settings
from app.core.errors import ERROR_RESPONSES, install_handlers
from app.core.jsonresp import SafeJSONResponse
from app.core.middleware import BodyLimitMiddleware, RedactTokens, RequestIdMiddleware
from app.dashboard.routes import router as dashboard
from app.datasets.routes import router as datasets
from app.health.routes import router as health
from app.jobs.routes import router as jobs
from app.plans.routes import router as plans
from app.plans.service import PLAN_SERVER
from app.runs.routes import router as runs
from app.scheduler.reaper import ApiReaper
from app.storage.delete import check_storage
from app.storage.routes import router as storage
from app.targets.routes import router as targets
from app.users.routes import router as users
from app.webhooks.routes import router as webhooks
from app.webhooks.sender import Sender
from app.wiring import wire


def _check_storage() -> None:
    try:
        check_storage()
    except Exception:  # a DB not reachable yet: the next start checks again
        logging.getLogger("draftyard.storage").exception("storage check failed")


def create_app() -> FastAPI:
    wire()

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        # The webhook outbox is sent from the API process; pending deliveries are in the DB,
        # so a restarted API picks up where the last one stopped.
        s = get_settings()
        announce(s)  # the shared folder's marker (app/cluster/shared.py)
        # Lost jobs are reaped here too while no worker is alive to do it.
        sender, reaper = Sender(), ApiReaper()
        sender.start()
        reaper.start()
        if s.plan_server and s.plan_warm_up:
            PLAN_SERVER.warm_up()
        # Deletes a killed process left half-done are finished, rows without files reported
        # (app/storage/delete.py); in a thread: the first request need not wait for it.
        threading.Thread(target=_check_storage, name="storage-check", daemon=True).start()
        try:
            yield
        finally:
            reaper.stop()
            sender.stop()

    # docs_url/redoc_url off: FastAPI's pages load Swagger UI and ReDoc from a CDN; the
    # dashboard router serves /docs from local files instead.
    app = FastAPI(title="draftyard", version="0.1.0", default_response_class=SafeJSONResponse,
                  docs_url=None, redoc_url=None, lifespan=lifespan)
    install_handlers(app, caller_before_body)
    app.add_middleware(BodyLimitMiddleware)  # inside RequestId: its 413 gets an id too
    app.add_middleware(RequestIdMiddleware)
    # Routes match in the order they were included, each request trying every route before
    # its own: the jobs router goes first, since `GET /v1/jobs/{id}` is the read every
    # client polls (no other router's paths overlap its /v1/jobs prefix).
    app.include_router(jobs, responses=ERROR_RESPONSES)
    for r in (health, dashboard):
        app.include_router(r)
    for r in (users, cluster, targets, datasets, artifacts, runs, plans, webhooks, storage):
        app.include_router(r, responses=ERROR_RESPONSES)
    logging.getLogger("draftyard").setLevel(logging.INFO)
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactTokens) for f in access.filters):
        access.addFilter(RedactTokens())
    return app
