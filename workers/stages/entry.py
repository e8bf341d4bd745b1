"""The one door into a stage: a spec's params and resolved inputs are validated here, once,
by the job type's models (contracts/jobtypes.py `params` and `resolved`; the plan's in
contracts/resolved.py), their paths checked against the spec's roots, and the stage is called
with typed values: `run(params, inputs, ctx)`. No stage parses its own params or reads a
resolved input by string key (tests/stages/test_stage_boundary.py holds that).

A malformed params or inputs is one `StageError` shape (workers/stages/kernel.py): code
`invalid_params` / `invalid_input`, the message naming each field as the spec spells it
(`params.lr`, `inputs.target.path`).

`python -m workers.stages <type> --spec spec.json` (workers/stages/__main__.py) reads the
file and comes here; a test calls `call(type, spec, ctx)` with the same dict.

Imports nothing heavy and nothing from app/, SQLAlchemy, Celery or HTTP."""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import BaseModel

from contracts.jobtypes import JOB_TYPES
from contracts.resolved import PlanInputs, PlanParams
from workers.stages.common import StageContext, check_roots
from workers.stages.kernel import parse_model, parse_params

# Every job type, and `plan` (the API's dry run of a run's body, never a job): its params
# model and its resolved inputs model.
MODELS: dict[str, tuple[type[BaseModel], type[BaseModel]]] = {
    **{n: (d.params, d.resolved) for n, d in JOB_TYPES.items()},
    "plan": (PlanParams, PlanInputs),
}
STAGES = tuple(MODELS)


def parse(type_: str, spec: dict[str, Any]) -> tuple[Any, Any]:
    """(params, inputs) of a stage spec, typed; a missing or null params is `{}` (every
    default), missing inputs are `{}` (so a required one is named)."""
    params_model, inputs_model = MODELS[type_]
    params = parse_params(params_model, spec.get("params"))
    inputs = parse_model(inputs_model, spec.get("inputs") or {}, "inputs", "invalid_input")
    return params, inputs


def call(type_: str, spec: dict[str, Any], ctx: StageContext) -> dict:
    """Parse `spec`, check its paths, run the stage `type_`; returns its summary."""
    params, inputs = parse(type_, spec)
    check_roots(inputs, spec.get("roots"))
    mod = importlib.import_module(f"workers.stages.{type_}")
    return mod.run(params, inputs, ctx) or {}
