"""Which target layers to store, and what a layer id means.

Layer ids follow speculators and vLLM (`eagle_aux_hidden_state_layer_ids`): id i is the
residual stream entering decoder layer i, which is HF `output_hidden_states[i]` (0 is the
embeddings). id N (N = num_hidden_layers) is the output of the last decoder layer *before*
the final norm: speculators splits it off as `verifier_last_hidden_states` and applies the
verifier's norm itself (docs/FIELD-NOTES.md "Hidden states"), so HF's post-norm last entry would be
normed twice. Every stored file holds the aux layers in the order given, then layer N.

Pure: no torch, so the planner and `POST /v1/plans` can use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contracts import drafters
from contracts.target import layer_ids_problem, text_config
from workers.stages.common import StageError


def num_hidden_layers(config: dict[str, Any]) -> int:
    n = text_config(config).get("num_hidden_layers")
    if not isinstance(n, int) or n < 1:
        raise StageError("invalid_input", "target config has no positive `num_hidden_layers`")
    return n


def hidden_size(config: dict[str, Any]) -> int:
    h = text_config(config).get("hidden_size")
    if not isinstance(h, int) or h < 1:
        raise StageError("invalid_input", "target config has no positive `hidden_size`")
    return h


def default_layer_ids(drafter_type: str, num_layers: int) -> list[int]:
    """The drafter type's default aux layer ids (contracts/drafters.py, where each type's rule
    is), as the stages' `invalid_params` error for a type that is not registered."""
    try:
        return drafters.default_layer_ids(drafter_type, num_layers)
    except drafters.UnknownDrafter as e:
        raise StageError("invalid_params", f"drafter_type: {e}") from None


@dataclass(frozen=True)
class LayerPlan:
    aux: tuple[int, ...]          # aux layer ids, in the order stored
    num_target_layers: int        # N; the last stored layer is id N (input of the final norm)
    hidden_size: int

    @property
    def stored(self) -> tuple[int, ...]:
        """All ids in file order: aux, then N (what vLLM's extractor is given)."""
        return (*self.aux, self.num_target_layers)

    @property
    def num_stored(self) -> int:
        return len(self.aux) + 1


def validate_layer_ids(layer_ids: list[int], num_layers: int,
                       field: str = "layer_ids") -> list[int]:
    """The one validity rule of aux layer ids (`contracts.target.layer_ids_problem`) as the
    stages' `invalid_params` error. `field`: the param as the caller's spec spells it."""
    bad = layer_ids_problem(layer_ids, num_layers, field)
    if bad:
        raise StageError("invalid_params", bad.message, bad.details)
    return list(layer_ids)


def resolve_layers(config: dict[str, Any], drafter_type: str,
                   layer_ids: list[int] | None, field: str = "layer_ids") -> LayerPlan:
    """The layer plan for a target config: the given aux ids (validated) or the defaults."""
    n = num_hidden_layers(config)
    aux = (validate_layer_ids(layer_ids, n, field) if layer_ids is not None
           else default_layer_ids(drafter_type, n))
    return LayerPlan(aux=tuple(aux), num_target_layers=n, hidden_size=hidden_size(config))


def linear_layer_indices(config: dict[str, Any]) -> list[int]:
    """Decoder layers that are not softmax attention (gated delta net, Mamba, ...). Their
    state runs across the whole row, so documents cannot share a packed row."""
    tc = text_config(config)
    types = tc.get("layer_types") or []
    return [i for i, t in enumerate(types) if t not in ("full_attention", "sliding_attention")]


def is_hybrid(config: dict[str, Any]) -> bool:
    tc = text_config(config)
    ssm_keys = ("linear_num_key_heads", "mamba_d_state", "ssm_state_size", "mamba_expand")
    return bool(linear_layer_indices(config)) or any(k in tc for k in ssm_keys)
