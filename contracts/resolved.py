"""A job's inputs as its stage receives them: each reference a client named (contracts/inputs.py)
resolved to what it is on this server, typed. app/jobs/inputs.py builds them (the only place
that does); the stage entry point (workers/stages/entry.py) validates a spec's inputs against
the job type's model here once and hands the stage these values, so no stage reads a target
or an artifact by string key and a spec written by hand that lacks a field is refused naming
it (`inputs.target.path`).

- `ResolvedTarget`: a registered target model (its files, tokenizer, chat template, config);
- `ResolvedArtifact`: an artifact (a dataset's, a job's output, or one named by id);
- `ResolvedDataset`: a mix source, a dataset's artifact with the share the mix takes of it;
- `SourceFile` (contracts/inputs.py): the one file an ingest job reads, as the client named it.

Each job type names its model (`JobTypeDef.resolved`, contracts/jobtypes.py); the plan (the
API's dry run, never a job) has `PlanInputs` and `PlanParams`.

Imports nothing but pydantic and contracts/."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from contracts.inputs import SourceFile

NonEmpty = Field(min_length=1)


class _R(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResolvedTarget(_R):
    kind: Literal["target"] = "target"
    id: str | None = None  # None: a spec an operator wrote to run a stage alone
    path: str = NonEmpty
    tokenizer_path: str | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    # The whole config.json as registered ({}: read it from `path`, workers/stages/kernel.py).
    config: dict[str, Any] = Field(default_factory=dict)

    @property
    def tokenizer(self) -> str:
        """Where its tokenizer is: its own folder unless registered apart."""
        return self.tokenizer_path or self.path


class ResolvedArtifact(_R):
    kind: str | None = None  # dataset, tokenized, hidden_states, drafter, ...
    id: str | None = None
    path: str = NonEmpty
    # The artifact's manifest as published (free-form per kind: contracts/storage.py).
    meta: dict[str, Any] = Field(default_factory=dict)
    # Set when the reference was a dataset id.
    dataset_id: str | None = None
    name: str | None = None


class ResolvedDataset(ResolvedArtifact):
    """A mix source (contracts/inputs.MixSource) resolved: the dataset's artifact, its share."""
    # As the mix stage reads them: 0 takes none of a source (the API asks for more).
    weight: float | None = Field(None, ge=0, le=1e9, allow_inf_nan=False)
    max_records: int | None = Field(None, ge=0, le=2**62)


Resolved = ResolvedTarget | ResolvedArtifact


# -- per job type ------------------------------------------------------------------------------

class ProbeResolved(_R):
    pass


class IngestResolved(_R):
    source: SourceFile


class MixResolved(_R):
    sources: list[ResolvedDataset] = Field(min_length=1, max_length=256)


class SplitResolved(_R):
    dataset: ResolvedArtifact


class GenerateResolved(_R):
    dataset: ResolvedArtifact
    target: ResolvedTarget


class PrepareResolved(_R):
    dataset: ResolvedArtifact
    target: ResolvedTarget


class ExtractResolved(_R):
    tokenized: ResolvedArtifact
    target: ResolvedTarget


class TrainResolved(_R):
    tokenized: ResolvedArtifact
    target: ResolvedTarget
    hidden_states: ResolvedArtifact | None = None  # extract's output: offline mode reads it


class EvaluateResolved(_R):
    """`data`: a tokenized set or a dataset (its `kind` says which); `baseline_drafter`:
    measured beside the drafter in place of the untrained one."""
    target: ResolvedTarget
    drafter: ResolvedArtifact
    data: ResolvedArtifact
    baseline_drafter: ResolvedArtifact | None = None


# -- the plan (app/plans/service.py starts it; workers/stages/plan.py runs it) -----------------

class PlanInputs(_R):
    target: ResolvedTarget
    dataset: ResolvedArtifact | None = None  # None: the dataset is not ready yet


class PlanParams(_R):
    run: dict[str, Any]  # the POST /v1/runs body (contracts/run.RunSpec, checked by the plan)
    sample: int = Field(200, ge=1, le=1_000_000)
    disk_path: str | None = None
    free_bytes_override: int | None = Field(None, ge=0)
    rates: dict[str, Any] | None = None
