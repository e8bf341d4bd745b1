"""What each job type *is*, in one place: its params and inputs models, which artifact kinds
each input accepts, its stage version, whether it resumes and is preemptible by default,
whether it may use GPUs, whether its finished work may be reused, whether (and why) it loads
its target's weights, whether its stage loads a model or streams records, what it reserves on
disk, and its one-line summary. The API (submit checks), the scheduler (reuse, disk
reservations), the fingerprint, the run expansion, the stages' entry point, the workers' warm
starters and the CLI read this registry; nothing else lists job types
(tests/service/test_jobtypes.py holds the derived sets to it).

Imports nothing but pydantic and contracts/: `app/` uses it without the pipeline core."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel

from contracts.evaluate import EvalParams
from contracts.extract import ExtractParams
from contracts.generate import GenerateParams
from contracts.ingest import IngestParams
from contracts.inputs import (EvaluateInputs, ExtractInputs, GenerateInputs, IngestInputs,
                              MixInputs, PrepareInputs, ProbeInputs, SplitInputs, TrainInputs)
from contracts.mix import MixParams
from contracts.resolved import (EvaluateResolved, ExtractResolved, GenerateResolved,
                                IngestResolved, MixResolved, PrepareResolved, ProbeResolved,
                                SplitResolved, TrainResolved)
from contracts.prepare import PrepareParams
from contracts.probe import ProbeParams
from contracts.split import SplitParams
from contracts.train import TrainParams


class JobType(StrEnum):
    ingest = "ingest"
    mix = "mix"
    split_ = "split"  # the name `split` would shadow str.split
    generate = "generate"
    prepare = "prepare"
    extract = "extract"
    train = "train"
    evaluate = "evaluate"
    probe = "probe"


@dataclass(frozen=True)
class JobTypeDef:
    name: JobType
    params: type[BaseModel]
    inputs: type[BaseModel]
    # input name -> the artifact kinds it accepts (a dataset id resolves to its dataset
    # artifact, a target id to the target, `{"job": id}` to that job's output of a kind here)
    accepts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Part of the reuse fingerprint: bump it when the stage's output for the same inputs and
    # params changes.
    version: int = 1
    # A requeued attempt continues from what the stopped one saved in work_dir (checkpoints,
    # finished shards): only such a type may be preempted.
    resumable: bool = False
    preemptible_by_default: bool = False
    # Does the stage use the GPUs it is given (CPU-only types run where a CPU slot is free)?
    gpu: bool = False
    # A finished job with the same fingerprint may stand in for a new one.
    reusable: bool = True
    # Why the stage loads its target's weights (None: the config and tokenizer suffice). A
    # config-only target (contracts/target.py has_weights) is refused for such a type: by the
    # run's plan and at submit.
    target_weights: str | None = None
    # The stage imports torch, transformers and speculators to load a model: a worker's warm
    # model starter forks it (workers/stages/starter.py profile "model").
    model_stage: bool = False
    # A streaming data stage, whose peak memory must not grow with its records: lean
    # allocators before pyarrow (workers/stages/memory.py), forked by the data starter.
    streaming: bool = False
    # What a job reserves on the scratch volume when placed (app/storage/reserve.py ESTIMATES
    # maps it to its estimate from the job's inputs and params); None: it states none.
    disk: Literal["hidden_states", "tokenized", "generated"] | None = None
    # One line for the CLI (`draftyard submit --help`).
    summary: str = ""
    # The inputs as the stage receives them, resolved (contracts/resolved.py): the stage entry
    # point (workers/stages/entry.py) validates a spec's inputs with it.
    resolved: type[BaseModel] = field(kw_only=True)

    def __post_init__(self) -> None:
        if not self.summary:
            raise TypeError(f"{self.name}: no summary")
        if self.model_stage and self.streaming:
            raise TypeError(f"{self.name}: a model stage does not stream records")
        names = set(self.inputs.model_fields)
        if set(self.accepts) != names:
            raise TypeError(f"{self.name}: accepts {sorted(self.accepts)} but the inputs "
                            f"model has {sorted(names)}")
        if set(self.resolved.model_fields) != names:
            raise TypeError(f"{self.name}: resolved inputs {sorted(self.resolved.model_fields)} "
                            f"but the inputs model has {sorted(names)}")
        if self.preemptible_by_default and not self.resumable:
            raise TypeError(f"{self.name}: preemptible by default but not resumable")

    @property
    def required(self) -> tuple[str, ...]:
        """The inputs a job of this type must name (the inputs model's required fields)."""
        return tuple(n for n, f in self.inputs.model_fields.items() if f.is_required())


_T = ("target",)
_RUNS = "runs the target"
JOB_TYPES: dict[str, JobTypeDef] = {d.name.value: d for d in (
    # probe: diagnostics, nothing to lose when stopped, never reused.
    JobTypeDef(JobType.probe, ProbeParams, ProbeInputs, resolved=ProbeResolved,
               resumable=True, gpu=True, reusable=False,
                summary="a node's facts (or a sleep or failure on purpose)"),
    JobTypeDef(JobType.ingest, IngestParams, IngestInputs, {"source": ("upload", "path")},
               resolved=IngestResolved,
               streaming=True, summary="a chat-data file -> a dataset"),
    JobTypeDef(JobType.mix, MixParams, MixInputs, {"sources": ("dataset",)},
               resolved=MixResolved, streaming=True,
               summary="several datasets -> one, in chosen shares"),
    # split: one dataset -> a training part and a held-out part (seeded).
    JobTypeDef(JobType.split_, SplitParams, SplitInputs, {"dataset": ("dataset",)},
               resolved=SplitResolved,
               streaming=True, summary="a dataset -> a training part and a held-out part"),
    # generate and extract resume from their finished shards/samples; they may opt in.
    JobTypeDef(JobType.generate, GenerateParams, GenerateInputs,
               {"dataset": ("dataset",), "target": _T}, resolved=GenerateResolved,
               resumable=True, gpu=True,
               target_weights=f"{_RUNS} to write the answers", model_stage=True,
               disk="generated", summary="a dataset whose answers the target writes"),
    JobTypeDef(JobType.prepare, PrepareParams, PrepareInputs,
               {"dataset": ("dataset",), "target": _T}, resolved=PrepareResolved,
               disk="tokenized",
               summary="a dataset -> token ids and loss masks for the target"),
    JobTypeDef(JobType.extract, ExtractParams, ExtractInputs,
               {"tokenized": ("tokenized",), "target": _T}, resolved=ExtractResolved,
               resumable=True, gpu=True,
               target_weights=f"{_RUNS} to capture its hidden states", model_stage=True,
               disk="hidden_states", summary="the target's hidden states (offline training)"),
    # train checkpoints on SIGTERM: preemptible unless an admin exempts the job.
    JobTypeDef(JobType.train, TrainParams, TrainInputs,
               {"tokenized": ("tokenized",), "target": _T, "hidden_states": ("hidden_states",)},
               resolved=TrainResolved,
               resumable=True, preemptible_by_default=True, gpu=True,
               target_weights="builds the drafter on the target's embeddings and lm_head "
                              f"(online, it also {_RUNS})", model_stage=True,
               summary="a drafter, trained on the target's hidden states"),
    JobTypeDef(JobType.evaluate, EvalParams, EvaluateInputs,
               {"target": _T, "drafter": ("drafter",), "data": ("tokenized", "dataset"),
                "baseline_drafter": ("drafter",)}, resolved=EvaluateResolved, gpu=True,
               target_weights=f"{_RUNS} alone and with the drafter", model_stage=True,
               summary="a drafter's acceptance (tau, per position) with the target"),
)}
assert set(JOB_TYPES) == set(JobType), "every JobType has exactly one definition"

RESUMABLE = frozenset(n for n, d in JOB_TYPES.items() if d.resumable)
NEVER_REUSE = frozenset(n for n, d in JOB_TYPES.items() if not d.reusable)
# type -> why it loads the target's weights, in pipeline order (generate, extract, train,
# evaluate); every other type needs the target's config and tokenizer at most.
NEEDS_TARGET_WEIGHTS = {n: w for n, d in JOB_TYPES.items() if (w := d.target_weights)}
# The stages a worker's warm model starter forks, and the streaming ones (the data starter).
MODEL_STAGES = frozenset(n for n, d in JOB_TYPES.items() if d.model_stage)
STREAMING_STAGES = frozenset(n for n, d in JOB_TYPES.items() if d.streaming)
# The types that state what they will write (app/storage/reserve.py).
RESERVES = tuple(n for n, d in JOB_TYPES.items() if d.disk)


def job_type(name: str) -> JobTypeDef:
    return JOB_TYPES[name]
