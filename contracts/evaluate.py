"""Typed params and inputs of the `evaluate` stage, validated before anything is loaded."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contracts.vllm import VllmServeOptions


class EvalVllmOptions(VllmServeOptions):
    """The server of the "vllm" measure: engine options, context and memory share."""

    max_model_len: int | None = Field(None, ge=16)  # None: the model's context length
    gpu_memory_utilization: float | None = Field(None, gt=0.0, le=1.0)  # None: vLLM's


Measure = Literal["tau_sim", "specdec", "vllm"]
DEFAULT_MEASURES: tuple[Measure, ...] = ("tau_sim", "specdec")


class EvalParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="after")
    def _lookup_range(self) -> "EvalParams":
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min ({self.prompt_lookup_min}) must not exceed "
                             f"prompt_lookup_max ({self.prompt_lookup_max})")
        return self

    # docs/FIELD-NOTES.md demo: 32 held-out prompts x 96 new tokens separate trained from untrained.
    num_prompts: int = Field(32, ge=1, le=100_000)
    max_new_tokens: int = Field(96, ge=1, le=32_768)
    # Verify block = drafted tokens + 1; None = as the drafter was trained.
    block_size: int | None = Field(None, ge=2, le=64)
    # Override template text and kwargs (e.g. enable_thinking) for rendering dataset prompts.
    chat_template: str | None = None
    chat_template_kwargs: dict = Field(default_factory=dict)
    # The verdict (the job itself still succeeds either way): "accept" only when
    # tau >= min_tau AND tau beats the baseline's tau by at least min_gain; None switches a
    # check off. 1.5: below 1.5 tokens per target forward, drafting plus verifying K+1
    # tokens rarely pays for itself (trained DFlash drafters reach 3-6; the demo 5.3).
    min_tau: float | None = Field(
        1.5, ge=0.0, description="reject a drafter whose tau is below this (None: no floor)")
    # 0.2 tokens per forward: an untrained drafter measures tau 1.00 +- a few hundredths
    # on the tiny targets, so a smaller gain is not a measured improvement.
    min_gain: float | None = Field(
        0.2, ge=0.0, description="reject a drafter whose tau does not exceed the baseline's "
                                 "by this much (None: no comparison)")
    # Prompt lookup (vLLM's `ngram` method, workers/stages/evaluate/prompt_lookup.py) is
    # measured beside every drafter with the same num_speculative_tokens, and the verdict
    # rejects a drafter that does not beat its tau by min_gain: it needs no training. 2..5:
    # vLLM's own default is 5..5 ("arbitrarily chosen" there); shorter n-grams match more
    # often, so 2 makes the free baseline stronger, the honest side to err on.
    prompt_lookup_min: int = Field(2, ge=1, le=64, description="shortest n-gram prompt lookup "
                                   "matches (vLLM's prompt_lookup_min)")
    prompt_lookup_max: int = Field(5, ge=1, le=64, description="longest n-gram prompt lookup "
                                   "matches (vLLM's prompt_lookup_max)")
    measures: list[Measure] = Field(default_factory=lambda: list(DEFAULT_MEASURES), min_length=1)
    # "untrained": the same drafter config with fresh seeded weights, when no
    # baseline_drafter input is given. None: no baseline.
    baseline: Literal["untrained"] | None = "untrained"
    seed: int = 0
    # What `data` is, set by a run (contracts/run.py) and named in the report and the verdict:
    # "held_out" (the split stage's records the drafter never saw), "in_sample" (the run's
    # own tokenized rows, as the run asked), "given" (stages.evaluate.data). None: not said.
    evaluated_on: Literal["held_out", "in_sample", "given"] | None = None
    allow_template_mismatch: bool = False
    # Teacher-forced rows for tau_sim (cheap: one target forward and a few drafter forwards).
    tau_sim_rows: int = Field(256, ge=1, le=100_000)
    # GPU boxes: the engine options and port of the server of the "vllm" measure.
    vllm: EvalVllmOptions = Field(default_factory=EvalVllmOptions)
    vllm_port: int = Field(8765, ge=1024, le=65535)
