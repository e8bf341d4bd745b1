"""One attempt of a job as the worker carries it from claim to outcome: built once, from one
resolve of the job's inputs, then read by the supervisor (what to start, where it reports)
and by the publisher (where the artifacts are, which inputs they came from)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from contracts.spec import StageSpec


@dataclass(frozen=True)
class Attempt:
    job_id: str
    number: int
    job_dir: Path         # shared: the job's log, work/, out-<n>/
    spec: StageSpec
    spec_path: Path       # the spec as written, in the attempt's node-local scratch
    input_ids: list[str]  # the artifacts it reads: the lineage of what it publishes

    @property
    def type(self) -> str:
        assert self.spec.type is not None
        return self.spec.type

    @property
    def scratch(self) -> Path:
        return self.spec_path.parent

    @property
    def out_dir(self) -> Path:
        return Path(self.spec.out_dir)

    @property
    def events_path(self) -> Path:
        assert self.spec.events_path is not None
        return Path(self.spec.events_path)

    @property
    def gpus(self) -> list[int]:
        return self.spec.gpus
