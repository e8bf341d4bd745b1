"""Run submission (API.md "Runs"). The body is `contracts.run.RunSpec`: the plan stage reads
and expands the same model, so both see the same jobs."""

from __future__ import annotations

from contracts.run import DrafterSpec, RunSpec, Stages

RunCreate = RunSpec

__all__ = ["DrafterSpec", "RunCreate", "Stages"]
