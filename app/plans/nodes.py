"""The plan's check of the deployment: a GPU stage with no node to run on is a
warning at plan time, not a job that waits forever with a late reason."""

from __future__ import annotations

from app.core.db import unit_of_work
from app.scheduler.reads import no_gpu_node_reason
from contracts.run import RunSpec, RunSpecError


def gpu_node_warnings(body: RunSpec) -> list[str]:
    try:
        chain = body.expand()
    except RunSpecError:
        return []  # the plan stage reports the run's own error
    with unit_of_work(read_only=True) as session:
        return [f"stages.{j.stage}.gpus {j.gpus}: {why}" for j in chain
                if (why := no_gpu_node_reason(session, j.gpus))]
