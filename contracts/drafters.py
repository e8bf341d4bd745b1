"""Every drafter type draftyard trains, evaluates and serves, defined once.

A `DrafterDef` says what a type is to each part of the pipeline: the params it takes beyond
the common ones (its options model, with their defaults), the target layers it is trained on
by default, the training modes it supports, what the extract stage must produce for it, which
implementation the train and evaluate stages use for it (a key each stage maps to its code:
contracts stay pydantic-only, no torch), and the vLLM method and speculative config it is
served with. The run body, the train and extract params, the plan, the disk reservation, the
evaluate stage and the CLI read this registry; nothing else lists drafter types
(tests/contracts/test_drafters.py holds them to it, and adds a type in one place).

A type's name is speculators' model type (`speculators_model_type` in a checkpoint's
config.json), which is also what `drafter.type` takes in the API.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

Mode = Literal["offline", "online"]
Loss = Literal["ce", "kl_div"]
# What extract stores for a drafter: the aux layers in the order given, then layer N (the
# input of the final norm, speculators' `verifier_last_hidden_states`; see
# workers/stages/extract/layers.py). The train stage's online server taps the same.
Extract = Literal["aux_then_last"]


class DrafterOptions(BaseModel):
    """The fields of contracts/train.py `DrafterParams` that only some types take: a type's
    own, with its defaults. The bounds stay on `DrafterParams` (one field, one bound), so a
    field named here must be one of its fields (tests/contracts/test_drafters.py)."""

    model_config = ConfigDict(extra="forbid")

    def speculative_tokens(self) -> int:
        """Tokens one draft pass proposes (vLLM's num_speculative_tokens)."""
        raise NotImplementedError


class DFlashOptions(DrafterOptions):
    # Tokens per drafted block: the anchor + block_size-1 speculative tokens.
    block_size: int = 8
    # Anchors sampled per packed row (speculators' --max-anchors, default 512).
    num_anchors: int = 512
    # The mask token; None = the tokenizer's mask token, else a spare embedding slot, else
    # pad/eos (Qwen3's tokenizer fills its embedding, docs/FIELD-NOTES.md).
    mask_token_id: int | None = None

    def speculative_tokens(self) -> int:
        return self.block_size - 1


class Eagle3Options(DrafterOptions):
    # Test-time-training unroll depth = the speculative tokens vLLM serves.
    ttt_steps: int = 4

    def speculative_tokens(self) -> int:
        return self.ttt_steps


class PEagleOptions(DrafterOptions):
    # Parallel depths: the tokens one forward drafts (speculators' --num-depths, default 8).
    num_depths: int = 8
    # Seed positions sampled per packed row for the deeper depths (speculators' max_anchors).
    num_anchors: int = 512
    # The token of the slots drafted in parallel; resolved as for DFlash. vLLM reads it as
    # its `pard_token`.
    mask_token_id: int | None = None

    def speculative_tokens(self) -> int:
        return self.num_depths


class DSparkOptions(DFlashOptions):
    # DFlash's block, every slot drafting (speculators' sample_from_anchor, its DSpark
    # default): the anchor slot predicts the next token too, so a block drafts block_size.

    def speculative_tokens(self) -> int:
        return self.block_size


class MTPOptions(DrafterOptions):
    # Steps the target's MTP layer is unrolled (speculators' --num-speculative-steps,
    # default 3), each feeding its output hidden state to the next.
    num_speculative_steps: int = 3

    def speculative_tokens(self) -> int:
        return self.num_speculative_steps


def _dflash_layers(n: int) -> list[int]:
    """Five layers evenly spaced from layer 1 to N-3 in z-lab's numbering (their id j is the
    *output* of layer j), i.e. j + 1 in ours; this is how speculators' DFlash converter maps
    z-lab checkpoints, e.g. Qwen3-8B (N=36) -> [2, 10, 18, 26, 34]."""
    start, end, k = 1, n - 3, 5
    return [int(round(start + i * (end - start) / (k - 1))) + 1 for i in range(k)]


def _eagle3_layers(n: int) -> list[int]:
    """Low, middle, high = [2, N//2, N-3], speculators' own default
    (`speculators.models.utils.resolve_target_layer_ids`)."""
    return [2, n // 2, n - 3]


class Impl(StrEnum):
    """The implementations the stages provide, by the key a DrafterDef names them with: the
    train recipe (workers/stages/train/build.py RECIPES) and the evaluate proposer
    (workers/stages/evaluate/proposers.py PROPOSERS). A new type reuses one, or adds one
    here and beside it in those two tables."""

    DFLASH = "dflash"
    EAGLE3 = "eagle3"
    PEAGLE = "peagle"
    DSPARK = "dspark"
    MTP = "mtp"


@dataclass(frozen=True)
class DrafterDef:
    name: str
    options: type[DrafterOptions]
    # Aux target layer ids for a target of N decoder layers, before clamping to the target
    # (default_layer_ids); layer N is stored in addition.
    layers: Callable[[int], list[int]]
    # The decoder the draft layers are built as (speculators' `draft_arch`).
    draft_arch: str
    # How it is trained: offline from the extract stage's stored hidden states, online
    # from a server that computes them as training goes.
    modes: frozenset[Mode] = frozenset({"offline", "online"})
    extract: Extract = "aux_then_last"
    default_loss: Loss = "kl_div"
    # Takes per-position loss weights (train's `position_weighting`).
    position_weighting: bool = False
    # The train stage's recipe for it (workers/stages/train/build.py RECIPES) and the
    # evaluate stage's proposer (workers/stages/evaluate/proposers.py PROPOSERS).
    train: str = ""
    evaluate: str = ""
    # Trained on speculators' shifted samples (token j+1 beside the hidden state of j,
    # `models/eagle3/data.shift_batch`), as its CLI does for the EAGLE family.
    shifted: bool = False
    # vLLM's speculative method for a checkpoint of this type, and what else its
    # --speculative-config needs (docs/methods.md says where each comes from).
    vllm_method: str = ""
    vllm_options: Mapping[str, Any] = field(default_factory=dict)
    # Fine-tunes the target's own multi-token-prediction layers, so only a target whose
    # config has `mtp_num_hidden_layers` >= 1 can have it; vLLM serves it from the target
    # checkpoint (the artifact's `served_target/` carries the trained weights).
    target_mtp: bool = False

    def __post_init__(self) -> None:
        for key in ("train", "evaluate", "vllm_method"):
            if not getattr(self, key):
                object.__setattr__(self, key, self.name)

    def speculative_config(self, num_speculative_tokens: int) -> dict[str, Any]:
        """vLLM's --speculative-config for a checkpoint of this type (its `model`, the
        checkpoint's path, is the caller's to add)."""
        return {"method": self.vllm_method, "num_speculative_tokens": int(num_speculative_tokens),
                **self.vllm_options}


DEFAULT_DRAFTER = "dflash"
# The folder inside a target_mtp drafter's artifact that vLLM serves as the target: the
# target's files with the trained MTP layers in place (workers/stages/train/build.py).
SERVED_TARGET = "served_target"
DRAFTERS: dict[str, DrafterDef] = {}


class UnknownDrafter(ValueError):
    def __init__(self, name: object):
        super().__init__(f"drafter type {name!r} is not one of: {', '.join(DRAFTERS)}")


def drafter_types() -> tuple[str, ...]:
    return tuple(DRAFTERS)


def drafter(name: str) -> DrafterDef:
    """The definition of a drafter type; `UnknownDrafter` naming the known ones."""
    try:
        return DRAFTERS[name]
    except (KeyError, TypeError):
        raise UnknownDrafter(name) from None


def register(d: DrafterDef) -> DrafterDef:
    """Add a drafter type (at import for the built-in ones; a test may add its own)."""
    if d.name in DRAFTERS:
        raise TypeError(f"drafter type {d.name!r} is registered already")
    DRAFTERS[d.name] = d
    return d


@contextmanager
def registered(d: DrafterDef) -> Iterator[DrafterDef]:
    """`d` registered for the duration of the block (tests)."""
    register(d)
    try:
        yield d
    finally:
        DRAFTERS.pop(d.name, None)


def option_owners(field: str) -> list[str]:
    """The drafter types that take an option field."""
    return [n for n, d in DRAFTERS.items() if field in d.options.model_fields]


def option_fields() -> set[str]:
    """Every field some drafter type takes as its own."""
    return {f for d in DRAFTERS.values() for f in d.options.model_fields}


def default_layer_ids(drafter_type: str, num_layers: int) -> list[int]:
    """Aux layer ids a drafter of this type is trained on by default, on a target of
    `num_layers` decoder layers (the last layer is always stored in addition, so it is not
    listed here). Small targets where points coincide get the distinct ones only."""
    n = num_layers
    ids = drafter(drafter_type).layers(n)
    # Tiny targets (N < 5) push the formulas out of range: clamp, then dedupe in order.
    out: list[int] = []
    for i in ids:
        i = min(max(i, 1 if n > 1 else 0), n - 1)
        if i not in out:
            out.append(i)
    return out


def target_problem(drafter_type: str, config: Mapping[str, Any]) -> str | None:
    """Why a target (its config.json) cannot have a drafter of this type, or None."""
    d = drafter(drafter_type)
    if d.target_mtp:
        text = config.get("text_config") or config
        n = text.get("mtp_num_hidden_layers", config.get("mtp_num_hidden_layers"))
        if not (isinstance(n, int) and n >= 1):
            return (f"{d.name} fine-tunes the target's own multi-token-prediction layers, "
                    f"but the target config has mtp_num_hidden_layers={n} (Qwen3.5/3.6 "
                    "checkpoints carry them); pick another drafter type")
    return None


def _known(name: str) -> str:
    drafter(name)
    return name


def _enum(schema: dict[str, Any]) -> None:
    schema["enum"] = list(DRAFTERS)  # the types registered when the schema is made


# A field that names a drafter type: checked against the registry when it is validated (a
# type registered later is accepted, which a Literal could not do).
DrafterType = Annotated[str, AfterValidator(_known), Field(json_schema_extra=_enum)]


register(DrafterDef("dflash", DFlashOptions, _dflash_layers, draft_arch="qwen3",
                    default_loss="ce", position_weighting=True))
register(DrafterDef("eagle3", Eagle3Options, _eagle3_layers, draft_arch="llama", shifted=True))
# P-EAGLE: EAGLE-3's inputs, all depths drafted in one forward from mask slots. speculators'
# defaults for it: a qwen3 decoder, no norm before fc or on the output. vLLM serves it with
# its EAGLE-3 proposer in parallel-drafting mode (docs/methods.md).
register(DrafterDef("peagle", PEagleOptions, _eagle3_layers, draft_arch="qwen3", shifted=True,
                    vllm_method="eagle3", vllm_options={"parallel_drafting": True}))
# DSpark: DFlash's backbone and inputs plus a low-rank Markov logit-bias head conditioned on
# the previous token of the block (and a confidence head); vLLM has a `dspark` method.
register(DrafterDef("dspark", DSparkOptions, _dflash_layers, draft_arch="qwen3",
                    position_weighting=True))
# MTP: the target's native multi-token-prediction layer (Qwen3.5/3.6), fine-tuned on the
# input of the target's final norm, unrolled num_speculative_steps times. It reads no aux
# layer; one is stored all the same (layer N-1: every stored set lists at least one).
register(DrafterDef("mtp", MTPOptions, lambda n: [n - 1], draft_arch="", default_loss="ce",
                    modes=frozenset({"offline"}), target_mtp=True))
