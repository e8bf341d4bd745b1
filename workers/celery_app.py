"""The Celery worker entry: `celery -A workers.celery_app worker` (or `draftyard worker`).

Tasks are thin: they take ids and delegate to workers.runner (docs/ARCHITECTURE.md, docs/STYLE.md 4)."""

from __future__ import annotations

import os

from celery.signals import worker_shutting_down

from app.core.broker import RUN_JOB, SCHEDULE, celery_app
from app.scheduler.nudge import nudge
from app.wiring import wire
from workers.runner import run_job as _run
from workers.supervisor import request_stop

app = celery_app()
# Back to the broker within a second once it returns (workers/consumer.py).
app.conf.worker_consumer = "workers.consumer:QuickReconnectConsumer"
wire()  # this process changes job status too: same consequences as in the API (app/wiring.py)


def node_name() -> str:
    return os.environ.get("DRAFTYARD_NODE", "local")


@app.task(name=RUN_JOB, ignore_result=True)
def run_job(job_id: str) -> str:
    return _run(job_id, node_name())


@app.task(name=SCHEDULE, ignore_result=True)
def schedule() -> None:
    nudge()


@worker_shutting_down.connect
def _stop_stages(sig: str = "a shutdown", **_: object) -> None:
    """SIGTERM or SIGINT (Celery's warm shutdown, which would wait for every running task):
    stop the running stages now and requeue their jobs (workers/supervisor.py request_stop);
    the tasks then return, and the worker exits within `stop_grace_s` and a few seconds. Runs
    in the signal handler: it only sets a flag."""
    request_stop(str(sig))
