"""The FastAPI app factory."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import ORJSONResponse

from app.artifacts.routes import router as artifacts
from app.cluster.routes import router as cluster
from app.core.errors import install_handlers
from app.core.middleware import RequestIdMiddleware
from app.dashboard.routes import router as dashboard
from app.datasets.routes import router as datasets
from app.health.routes import router as health
from app.jobs.routes import router as jobs
from app.plans.routes import router as plans
from app.runs.routes import router as runs
from app.targets.routes import router as targets
from app.users.routes import router as users
from app.webhooks.routes import router as webhooks
from app.webhooks.sender import Sender
from app.wiring import wire


def create_app() -> FastAPI:
    wire()

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        # The webhook outbox is sent from the API process; pending deliveries are in the DB,
        # so a restarted API picks up where the last one stopped.
        sender = Sender()
        sender.start()
        try:
            yield
        finally:
            sender.stop()

    app = FastAPI(title="draftyard", version="0.1.0", default_response_class=ORJSONResponse,
                  lifespan=lifespan)
    install_handlers(app)
    app.add_middleware(RequestIdMiddleware)
    for r in (health, users, jobs, cluster, targets, datasets, artifacts, runs, plans,
              webhooks, dashboard):
        app.include_router(r)
    logging.getLogger("draftyard").setLevel(logging.INFO)
    return app
