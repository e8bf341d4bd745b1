"""Typed, validated params of the `train` stage.

Defaults follow speculators 0.9's own recipe where it has one (`speculators train`'s
`TrainConfig`), and docs/FIELD-NOTES.md where CPU needs something else. The API validates
a submitted job with these models (a 422 naming the field); the stage validates again.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contracts.drafters import (DRAFTERS, DrafterOptions, DrafterType, drafter,
                                option_fields, option_owners)
from contracts.target import layer_ids_problem
from contracts.vllm import VllmOptions


# Fields a resumed run may change without invalidating its checkpoint: they steer how long
# and how visibly the run goes, not what it computes per step.
STEERING_FIELDS = frozenset({"epochs", "max_steps", "checkpoint_every", "eval_every",
                             "log_every", "nproc", "num_workers", "online"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DrafterParams(_Strict):
    type: DrafterType
    # One layer: the docs/FIELD-NOTES.md demo setting; speculators' DFlash recipe uses 5 on GPUs.
    num_layers: int = Field(1, ge=1, le=64)
    # A type's own options (contracts/drafters.py, with their meaning and defaults); None:
    # the type's default. Given to a type that does not take it: refused.
    block_size: int | None = Field(None, ge=2, le=64)
    num_anchors: int | None = Field(None, ge=1, le=65536)
    ttt_steps: int | None = Field(None, ge=1, le=16)
    num_depths: int | None = Field(None, ge=2, le=16)
    num_speculative_steps: int | None = Field(None, ge=1, le=16)
    mask_token_id: int | None = Field(None, ge=0)
    # Aux layer ids; None = the hidden_states artifact's `layer_ids` (offline) or the
    # extract stage's default for this drafter type (online).
    target_layer_ids: list[int] | None = None
    # Draft vocabulary (d2t/t2d from the prepare stage's token_freq.pt); None = the full
    # target vocabulary. 2,048 keeps a CPU step cheap (docs/FIELD-NOTES.md: 151k vocab is 50x slower).
    draft_vocab_size: int | None = Field(2048, ge=16)

    @model_validator(mode="after")
    def _per_type(self) -> DrafterParams:
        d = drafter(self.type)
        own = d.options.model_fields
        for name in sorted(option_fields() - set(own)):
            if getattr(self, name) is not None:
                raise ValueError(f"{name} applies to {' and '.join(option_owners(name))} only"
                                 f" (not {self.type})")
        opts = d.options.model_validate({k: v for k in own
                                         if (v := getattr(self, k)) is not None})
        for k in own:  # the type's defaults in place of what was not given
            setattr(self, k, getattr(opts, k))
        if self.target_layer_ids is not None:  # the target's range: checked by the stage
            bad = layer_ids_problem(self.target_layer_ids, None, "target_layer_ids")
            if bad:
                raise ValueError(bad.message)
        return self

    @property
    def options(self) -> DrafterOptions:
        """This drafter's own options, as its type defines them."""
        d = drafter(self.type)
        return d.options.model_validate({k: getattr(self, k) for k in d.options.model_fields})

    @property
    def speculative_tokens(self) -> int:
        """Tokens one draft pass proposes (what vLLM's num_speculative_tokens gets)."""
        return self.options.speculative_tokens()


class OnlineParams(VllmOptions):
    # auto: vLLM when GPUs and vllm are present, else the in-process HF target.
    backend: Literal["auto", "vllm", "hf"] = "auto"
    vllm_gpus: int = Field(1, ge=1)              # leased GPUs given to the vLLM server
    gpu_memory_utilization: float = Field(0.85, gt=0.05, le=0.99)
    port: int | None = Field(None, ge=1024, le=65535)
    startup_timeout_s: float = Field(1200.0, gt=0)
    request_timeout_s: float = Field(120.0, gt=0)


class TrainParams(_Strict):
    mode: Literal["offline", "online"] = "offline"
    drafter: DrafterParams
    seq_length: int = Field(1024, ge=32, le=1 << 20)   # packed tokens per step and rank
    lr: float = Field(1e-2, gt=0, le=10)                # docs/FIELD-NOTES.md demo value (Muon)
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    warmup_steps: int = Field(0, ge=0)
    epochs: int = Field(1, ge=1, le=10000)
    max_steps: int | None = Field(None, ge=1)
    # None = speculators' default per type (contracts/drafters.py default_loss): ce (+ D-PACE
    # weighting) for dflash, kl_div for eagle3. kl_div on dflash uses fixed-exp-decay
    # weighting (D-PACE requires CE).
    loss: Literal["ce", "kl_div"] | None = None
    # DFlash per-position loss weights: D-PACE (speculators' DFlash default, CE only) or
    # exp_decay (exp(-(k-1)/4), the DFlash paper's). None = dpace for ce, else exp_decay.
    # D-PACE reweights by the draft's own confidence, so its value is not comparable
    # across training (it can rise while accuracy improves); exp_decay's is.
    position_weighting: Literal["dpace", "exp_decay"] | None = None
    optimizer: Literal["muon", "adamw"] = "muon"        # speculators' default
    weight_decay: float = Field(0.01, ge=0)
    checkpoint_every: int = Field(50, ge=1)
    eval_every: int | None = Field(None, ge=1)
    val_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    seed: int = 0
    distributed: Literal["ddp", "fsdp"] = "ddp"
    # None = flex on CUDA (speculators' default), sdpa on CPU (flex has no CPU backward).
    attention: Literal["sdpa", "eager", "flex"] | None = None
    log_every: int = Field(5, ge=1)
    # Processes; None = one per visible GPU (1 on CPU). >1 on CPU runs gloo DDP.
    nproc: int | None = Field(None, ge=1, le=64)
    # DataLoader workers; None = 0 on CPU (spawned workers cost more than they save on
    # two cores), 4 on GPU.
    num_workers: int | None = Field(None, ge=0, le=64)
    online: OnlineParams = Field(default_factory=OnlineParams)

    @model_validator(mode="after")
    def _cross(self) -> TrainParams:
        if self.eval_every is not None and self.val_fraction == 0.0:
            raise ValueError("eval_every needs val_fraction > 0")
        if self.distributed == "fsdp" and self.nproc == 1:
            raise ValueError("distributed=fsdp needs more than one process")
        kind = drafter(self.drafter.type)
        if self.mode not in kind.modes:
            raise ValueError(f"drafter type {kind.name} trains {' or '.join(sorted(kind.modes))}"
                             f" only, not {self.mode}")
        if self.position_weighting is not None and not kind.position_weighting:
            owners = [n for n, t in DRAFTERS.items() if t.position_weighting]
            raise ValueError(f"position_weighting applies to {' and '.join(owners)} only")
        if self.position_weighting == "dpace" and self.loss_fn != "ce":
            raise ValueError("position_weighting=dpace requires loss=ce")
        d = self.drafter
        if d.block_size is not None and self.seq_length <= d.block_size:
            raise ValueError(f"seq_length must exceed drafter.block_size ({d.block_size})")
        return self

    @property
    def loss_fn(self) -> str:
        return self.loss or drafter(self.drafter.type).default_loss

    @property
    def dflash_weighting(self) -> str:
        """speculators' per_position_loss_weight value."""
        w = self.position_weighting or ("dpace" if self.loss_fn == "ce" else "exp_decay")
        return "dpace" if w == "dpace" else "fixed-exp-decay"

    def fingerprint(self) -> dict:
        """The params that define what a training step computes (checkpoint identity)."""
        return self.model_dump(mode="json", exclude=set(STEERING_FIELDS))
