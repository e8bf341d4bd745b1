"""Typed params of the extract stage. Unknown fields are refused (a typo must not silently
fall back to a default that costs a day of GPU time)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contracts.drafters import DEFAULT_DRAFTER, DrafterType
from contracts.target import layer_ids_problem
from contracts.vllm import VllmOptions

# the free-disk margin the extract planner keeps (1 GiB)
DEFAULT_MARGIN_BYTES = 1 << 30


class ExtractVllmParams(VllmOptions):
    """How the stage runs its own vLLM server on the leased GPUs (backend vllm), private to
    the stage (127.0.0.1); which vLLM runs is the server's setting. It serves in `dtype`."""

    port: int | None = None          # None: a free port
    tensor_parallel_size: int = Field(1, ge=1)
    # None: every visible GPU not used by tensor parallelism serves a replica, which is how
    # records are sharded across the leased GPUs with one server.
    data_parallel_size: int | None = Field(None, ge=1)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    max_model_len: int | None = Field(None, ge=1)   # None: longest sample + 1 generated token
    max_num_batched_tokens: int | None = Field(None, ge=1)  # None: vLLM's default
    concurrency: int = Field(32, ge=1)               # requests in flight
    request_timeout_s: float = Field(600.0, gt=0)
    max_retries: int = Field(3, ge=0)
    startup_timeout_s: float = Field(1800.0, gt=0)   # loading a 27B target takes minutes


class ExtractParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    layer_ids: list[int] | None = None      # aux layers; None: the drafter type's defaults
    drafter_type: DrafterType = DEFAULT_DRAFTER
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    backend: Literal["auto", "hf", "vllm"] = "auto"
    # Positions (padding included) per forward: big enough to fill a GPU, small enough
    # that the stored activations of one batch fit next to the model.
    batch_tokens: int = Field(8192, ge=1)
    # padded: sorted by length + right padding (any target); packed: several samples per
    # row with restarting position ids (attention-only targets); auto: packed where the
    # attention kernel takes varlen rows (flash-attention on GPU), else padded.
    batch_mode: Literal["auto", "padded", "packed"] = "auto"
    # transformers' attention kernels (None: its default, sdpa). A closed list: transformers
    # also takes a hub repo here, whose kernel code it downloads and imports.
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2", "flash_attention_3",
                                 "flex_attention"] | None = None
    max_samples: int | None = Field(None, ge=1)     # the first max_samples rows
    disk_margin_bytes: int = Field(DEFAULT_MARGIN_BYTES, ge=0)
    free_bytes_override: int | None = Field(None, ge=0)  # tests/ops: pretend free disk
    # hf backend: data-parallel worker processes, one per device. None: one per visible
    # CUDA device (1 on CPU).
    workers: int | None = Field(None, ge=1)
    vllm: ExtractVllmParams = Field(default_factory=ExtractVllmParams)

    @field_validator("layer_ids")
    @classmethod
    def _layer_ids(cls, ids: list[int] | None) -> list[int] | None:
        # The part of the one rule that needs no target; the range is checked against the
        # target's config by the stage (and the run's plan).
        bad = layer_ids_problem(ids, None, "layer_ids") if ids is not None else None
        if bad:
            raise ValueError(bad.message)
        return ids
