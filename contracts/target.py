"""What a target's config means, for the API and every stage alike (STYLE 13: one home).

- `text_config`: the language model's config (multimodal checkpoints nest it);
  `text_value`: one key of it, found at whichever level the checkpoint keeps it.
- `has_weights`: whether a model folder holds weight files. A target registered from its
  config and tokenizer only (a config-only target, e.g. a 27B's shapes for planning) can be
  planned and prepared for; the job types that load its weights (contracts/jobtypes.py
  `target_weights`) are refused on it, by the plan and at submit.
- `layer_ids_problem`: the one validity rule of aux layer ids. Layer ids follow speculators
  and vLLM (`eagle_aux_hidden_state_layer_ids`): id i is the residual stream entering decoder
  layer i (0 is the embeddings); id N (N = num_hidden_layers) is the input of the final norm,
  always stored last by extract and read last by train and evaluate, so an aux list names
  distinct ids in [0, N-1]. Without N (a submitted job, before any target is resolved) the
  part that needs no target is checked: non-empty, distinct, >= 0.

Pure: the standard library only, so `app/` may use it without loading the pipeline core.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config (multimodal checkpoints nest it under `text_config`)."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) and "num_hidden_layers" in inner else config


def text_value(config: dict[str, Any] | None, key: str) -> Any:
    """`key` of the language model's config, else of the other level (checkpoints differ
    in where they keep `vocab_size` or `max_position_embeddings`); None when neither has it."""
    cfg = config or {}
    inner = cfg.get("text_config")
    for c in (text_config(cfg), cfg, inner if isinstance(inner, dict) else {}):
        if c.get(key) is not None:
            return c[key]
    return None


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def has_weights(path: str | None) -> bool:
    """Does the model folder `path` hold any weight file (a config-only target does not)?"""
    from pathlib import Path

    if not path:
        return False
    p = Path(path)
    return p.is_dir() and any(f.name.endswith(WEIGHT_SUFFIXES) for f in p.iterdir())


@dataclass(frozen=True)
class LayerIdsProblem:
    message: str                          # names the field as the caller spells it
    details: dict[str, Any] = field(default_factory=dict)


def layer_ids_problem(layer_ids: Any, num_layers: int | None = None,
                      field: str = "layer_ids") -> LayerIdsProblem | None:
    """Why `layer_ids` are not valid aux layer ids for a target of `num_layers` decoder
    layers (None: for any target), or None when they are."""
    n = num_layers
    # A range reads as one: "0..7" ("[0, 7]" read as the two layers 0 and 7).
    valid = f"0..{n - 1}" if n is not None else "0..N-1"
    rng = {"valid_range": [0, n - 1]} if n is not None else {}
    if not isinstance(layer_ids, (list, tuple)) or not layer_ids:
        return LayerIdsProblem(f"{field} must list at least one aux layer of layers {valid}"
                               + (f" (the target has {n} layers)" if n is not None else ""),
                               {"field": field, **rng})
    bad = [i for i in layer_ids if not isinstance(i, int) or isinstance(i, bool) or i < 0
           or (n is not None and i >= n)]
    if bad:
        hint = (f"; layer {n} (the input of the final norm) is always stored last, do not "
                f"list it") if n is not None and n in bad else ""
        target = f" for a target with {n} layers" if n is not None else ""
        return LayerIdsProblem(f"{field} {bad} out of range: valid aux layer ids are layers "
                               f"{valid}{target}{hint}",
                               {"field": field, "invalid": bad, **rng})
    if len(set(layer_ids)) != len(layer_ids):
        return LayerIdsProblem(f"{field} must be distinct, got {list(layer_ids)}",
                               {"field": field})
    return None


TEMPLATE_FILE_SUFFIXES = (".jinja", ".j2", ".txt")


def looks_like_template_path(text: str) -> bool:
    """A `chat_template` that is a file's name, not a template (a path was stored
    as the template's text and the plan later said `empty_turns x30`): one line, ending in
    .jinja/.j2/.txt, with no Jinja tag in it."""
    t = text.strip()
    return ("\n" not in t and t.lower().endswith(TEMPLATE_FILE_SUFFIXES)
            and "{%" not in t and "{{" not in t)


def template_path_message(text: str, field: str = "chat_template") -> str:
    return (f"{field} {text.strip()!r} looks like a file name, not a template: send the "
            f"file's content (the CLI's --chat-template FILE reads it for you)")

