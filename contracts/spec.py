"""The stage spec: what a stage process is told to do (`python -m workers.stages <type>
--spec spec.json`). One typed model, built in one place (`StageSpec.in_folder`) by whoever
starts a stage: the worker for a job attempt (workers/runner.py), the API for a plan
(app/plans/service.py). The stage entry point validates the file against it again, so a spec
written by hand (a shell, a test) that names an unknown key or a wrong type is refused before
the stage starts.

A stage reads only the paths in its spec and writes only under `out_dir` (its artifacts,
published by the worker on success) and `work_dir` (scratch that survives a retry:
checkpoints, finished shards); it reports to `events_path` (workers/stages/common.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class StageSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # The job type, or `plan`; a spec run from a shell may leave it to the command line.
    type: str | None = None
    job_id: str | None = None
    attempt: int = Field(1, ge=1)
    params: dict[str, Any] = Field(default_factory=dict)
    # Resolved inputs: artifact/target/dataset dicts (app/jobs/inputs.py), or an ingest's file.
    inputs: dict[str, Any] = Field(default_factory=dict)
    out_dir: str
    work_dir: str
    # This attempt's node-local folder (its spec, events and TMPDIR): nothing a retry needs.
    scratch_dir: str | None = None
    events_path: str | None = None
    gpus: list[int] = Field(default_factory=list)  # as leased; the stage sees them renumbered
    # The roots the stage checks its paths against again (workers/stages/common.check_roots);
    # none: a spec an operator wrote to run a stage alone.
    roots: dict[str, list[str]] | None = None
    # Server limits the stage holds its inputs to (`max_decompressed_bytes`: what a compressed
    # dataset file may inflate to, as uploads are held to); none: no limit.
    limits: dict[str, int] | None = None

    @classmethod
    def in_folder(cls, type_: str, folder: Path, scratch: Path, *, attempt: int = 1,
                  **fields: Any) -> StageSpec:
        """The spec of one attempt of a job whose folder is `folder`: its artifacts in
        `out-<attempt>/` (emptied by the caller before a new attempt), `work/` shared by the
        attempts, and its events in `scratch`, the attempt's own folder."""
        return cls(type=type_, attempt=attempt, out_dir=str(folder / f"out-{attempt}"),
                   work_dir=str(folder / "work"), scratch_dir=str(scratch),
                   events_path=str(scratch / "events.jsonl"), **fields)

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(self.model_dump(mode="json"), indent=1))
        return path
