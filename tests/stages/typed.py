"""Run a stage from a spec dict as its entry point does (workers/stages/entry.py): params and
resolved inputs parsed once by the job type's models, then `run(params, inputs, ctx)`. Tests
that used to call a stage's `run(spec, ctx)` call `run_stage(type, spec, ctx)`."""

from __future__ import annotations

from typing import Any

from workers.stages.common import StageContext
from workers.stages.entry import call, parse


def run_stage(type_: str, spec: dict[str, Any], ctx: StageContext | None = None) -> dict:
    """The stage `type_` run on `spec` (a context from the spec's folders when none given)."""
    return call(type_, spec, ctx if ctx is not None else StageContext.from_spec(spec))


def typed(type_: str, spec: dict[str, Any]) -> tuple[Any, Any]:
    """(params, inputs) of `spec` as the stage `type_` receives them."""
    return parse(type_, spec)


def train_job(spec: dict[str, Any], source: str, cuda: bool = False) -> Any:
    """The train stage's resolved `TrainJob` for `spec` (workers/stages/train/job.py)."""
    from workers.stages.train.job import resolve_job

    params, inputs = parse("train", spec)
    return resolve_job(params, inputs, StageContext.from_spec(spec), source, cuda=cuda)
