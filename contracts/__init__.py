"""The typed params of every job type: plain pydantic models shared by the control plane
(`POST /v1/jobs` and `POST /v1/runs` answer 422 naming the field, before anything is queued)
and the stages (which validate again: each runs alone from a shell too).

Imports nothing but pydantic: `app/` may use it without pulling in the pipeline core.
"""

from __future__ import annotations

from pydantic import BaseModel

from contracts.evaluate import EvalParams
from contracts.extract import ExtractParams
from contracts.generate import GenerateParams
from contracts.ingest import IngestParams
from contracts.mix import MixParams
from contracts.prepare import PrepareParams
from contracts.split import SplitParams
from contracts.train import TrainParams

STAGE_PARAMS: dict[str, type[BaseModel]] = {
    "ingest": IngestParams,
    "mix": MixParams,
    "split": SplitParams,
    "generate": GenerateParams,
    "prepare": PrepareParams,
    "extract": ExtractParams,
    "train": TrainParams,
    "evaluate": EvalParams,
}
