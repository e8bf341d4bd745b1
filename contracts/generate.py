"""Typed params of the `generate` stage; unknown fields are refused so a typo is not ignored."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contracts.vllm import VllmServeOptions


class GenerateVllmParams(VllmServeOptions):
    """How the stage serves the target; which vLLM runs is the server's setting."""

    tensor_parallel_size: int = Field(1, ge=1)
    data_parallel_size: int = Field(1, ge=1)
    # vLLM's own default: leaves room for the CUDA context and activations.
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    # None: the model's context length (vLLM reads it from config.json).
    max_model_len: int | None = Field(None, ge=16)
    # Requests in flight; vLLM batches them continuously, so more than its max_num_seqs
    # only queues on the server.
    concurrency: int = Field(64, ge=1, le=4096)
    # None: a free port picked at start.
    port: int | None = Field(None, ge=1024, le=65535)
    # Loading and compiling a large model can take many minutes on a cold cache.
    startup_timeout_s: float = Field(1800.0, gt=0)
    request_timeout_s: float = Field(1800.0, gt=0)
    # Attempts per request for transport errors, 429 and 5xx (tenacity, exponential backoff).
    max_attempts: int = Field(4, ge=1, le=20)


class GenerateParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: Literal["auto", "hf", "vllm"] = "auto"
    # all: every assistant turn, turn by turn (the target's own earlier answers become the
    # history); last: only the final answer. A record that ends on a user/tool turn gets a new
    # answer appended in both modes.
    turns: Literal["all", "last"] = "all"
    temperature: float = Field(0.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(256, ge=1)
    seed: int = 0
    stop: list[str] = Field(default_factory=list)
    # Template text that overrides the target's; None: the target's override or its tokenizer's.
    chat_template: str | None = None
    # Merged over the target's own kwargs (these win), e.g. {"enable_thinking": false}.
    chat_template_kwargs: dict = Field(default_factory=dict)
    batch_size: int = Field(32, ge=1, le=4096)
    max_failure_share: float = Field(0.1, ge=0.0, le=1.0)
    # None: limited only by the context (max_model_len or the config's max positions).
    max_prompt_tokens: int | None = Field(None, ge=1)
    # Records finished per shard in work_dir: what a kill can lose at most. None: 4 HF batches
    # or 8 x the vLLM concurrency.
    shard_records: int | None = Field(None, ge=1)
    vllm: GenerateVllmParams = Field(default_factory=GenerateVllmParams)

    @model_validator(mode="after")
    def _check(self) -> "GenerateParams":
        if any(not s for s in self.stop):
            raise ValueError("stop: empty strings are not allowed")
        return self
