"""The typed inputs of every job type: which names a job takes, which are
required, and the shape of each reference. contracts/jobtypes.py says which artifact kinds
each name accepts; the API checks that the references exist.

A reference is an id (`ds_`, `art_`, `tgt_`, `job_`), `{"artifact": id}`, or
`{"job": id, "output"?: name}` (the output of an earlier job; the new job waits for it).
Each job type's model is named in its definition (contracts/jobtypes.py)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from contracts.bounds import ServerPath

Id = Annotated[str, Field(min_length=1, max_length=200)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobRef(_In):
    job: Id
    output: Id | None = None


class ArtifactRef(_In):
    artifact: Id


Ref = Id | JobRef | ArtifactRef


class SourceFile(_In):
    """The one file an `ingest` job reads: inside DRAFTYARD_DATA_ROOTS (or an upload)."""
    path: ServerPath = Field(min_length=1)
    name: str | None = Field(None, max_length=200)


class MixSource(_In):
    dataset_id: Id
    weight: float | None = Field(None, gt=0, le=1e9)
    max_records: int | None = Field(None, ge=1, le=2**62)


class ProbeInputs(_In):
    pass


class IngestInputs(_In):
    source: SourceFile


class MixInputs(_In):
    sources: list[MixSource] = Field(min_length=1, max_length=256)


class SplitInputs(_In):
    dataset: Ref


class GenerateInputs(_In):
    dataset: Ref
    target: Ref


class PrepareInputs(_In):
    dataset: Ref
    target: Ref


class ExtractInputs(_In):
    tokenized: Ref
    target: Ref


class TrainInputs(_In):
    tokenized: Ref
    target: Ref
    hidden_states: Ref | None = None


class EvaluateInputs(_In):
    target: Ref
    drafter: Ref
    data: Ref
    baseline_drafter: Ref | None = None

