"""Find, check and load a speculators drafter checkpoint for evaluation.

The fit check reads only JSON (config.json and the safetensors headers), so a drafter built
for another target is refused before torch loads anything: a hidden-size or vocabulary
mismatch would otherwise surface as a shape error deep inside a forward, or worse, as a
silently meaningless acceptance number.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.drafters import DRAFTERS, Impl
from contracts.target import layer_ids_problem, text_config
from workers.stages.common import StageError


@dataclass(frozen=True)
class DrafterSpec:
    """What evaluation needs to know about a drafter checkpoint, read from its files."""

    path: Path
    kind: str                       # a drafter type (contracts/drafters.py)
    hidden_size: int
    vocab_size: int                 # target vocabulary the drafter was built for
    draft_vocab_size: int
    aux_layer_ids: list[int]
    num_speculative_tokens: int     # tokens proposed per step, as trained
    t2d_len: int | None             # length of the stored target->draft map, if any
    d2t_len: int | None
    verifier: str | None            # the verifier path recorded at training time


def find_checkpoint(path: Path | str) -> Path:
    """The folder holding the speculators config.json: `path` itself or one child of it.

    A draftyard drafter artifact may keep the checkpoint in a subfolder; any speculators
    checkpoint directory works as is.
    """
    root = Path(path)
    if _is_speculators_dir(root):
        return root
    if root.is_dir():
        found = sorted(p for p in root.iterdir() if p.is_dir() and _is_speculators_dir(p))
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise StageError("invalid_input", f"drafter path {root} holds several checkpoints "
                             f"({', '.join(p.name for p in found)}); point at one of them")
    raise StageError("invalid_input", f"no speculators checkpoint (config.json with "
                     f"speculators_model_type) at {root}")


def _is_speculators_dir(p: Path) -> bool:
    cfg = p / "config.json"
    if not cfg.is_file():
        return False
    try:
        return "speculators_model_type" in json.loads(cfg.read_text())
    except (OSError, ValueError):
        return False


def _safetensors_shapes(folder: Path) -> dict[str, list[int]]:
    """Tensor name -> shape from the headers of every safetensors file (no tensor data)."""
    shapes: dict[str, list[int]] = {}
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, info in header.items():
            if name != "__metadata__":
                shapes[name] = list(info["shape"])
    return shapes


def _first_dim(shape: list[int] | None) -> int | None:
    """A stored tensor's length, None when it is absent (or a scalar)."""
    return shape[0] if shape else None


# Proposers whose checkpoints have DFlash's layout (aux_hidden_state_layer_ids, block_size).
BLOCK_LAYOUT = frozenset({Impl.DFLASH, Impl.DSPARK})


def read_drafter(path: Path | str) -> DrafterSpec:
    ckpt = find_checkpoint(path)
    cfg = json.loads((ckpt / "config.json").read_text())
    kind = cfg["speculators_model_type"]
    if kind not in DRAFTERS:
        raise StageError("unsupported_drafter", f"drafter type {kind!r} at {ckpt}: evaluate "
                         f"supports {', '.join(DRAFTERS)}")
    tl = cfg.get("transformer_layer_config") or {}
    spec_cfg = cfg.get("speculators_config") or {}
    proposals = spec_cfg.get("proposal_methods") or [{}]
    if DRAFTERS[kind].evaluate in BLOCK_LAYOUT:  # the checkpoint layout of its proposer
        aux = cfg.get("aux_hidden_state_layer_ids")
        n_spec = int(cfg.get("block_size", 8)) - (0 if cfg.get("sample_from_anchor") else 1)
    elif DRAFTERS[kind].target_mtp:  # reads layer N, the input of the final norm
        aux = [tl.get("num_hidden_layers")]
        n_spec = int(proposals[0].get("speculative_tokens") or 3)
    else:
        aux = cfg.get("eagle_aux_hidden_state_layer_ids")
        n_spec = int(proposals[0].get("speculative_tokens") or 3)
    shapes = _safetensors_shapes(ckpt)
    return DrafterSpec(
        path=ckpt, kind=kind, hidden_size=int(tl.get("hidden_size", -1)),
        vocab_size=int(tl.get("vocab_size", -1)),
        draft_vocab_size=int(cfg.get("draft_vocab_size", tl.get("vocab_size", -1))),
        aux_layer_ids=list(aux or []), num_speculative_tokens=n_spec,
        t2d_len=_first_dim(shapes.get("t2d")), d2t_len=_first_dim(shapes.get("d2t")),
        verifier=(spec_cfg.get("verifier") or {}).get("name_or_path"),
    )


def check_fit(d: DrafterSpec, target_config: dict, label: str = "drafter") -> None:
    """Raise `drafter_target_mismatch` naming both values when `d` cannot run on the target."""
    t = text_config(target_config)
    problems: list[str] = []
    t_hidden, t_vocab = t.get("hidden_size"), t.get("vocab_size")
    t_layers = t.get("num_hidden_layers")
    if d.hidden_size != t_hidden:
        problems.append(f"hidden size: {label} {d.hidden_size}, target {t_hidden}")
    if d.vocab_size != t_vocab:
        problems.append(f"vocab size: {label} built for {d.vocab_size}, target {t_vocab}")
    if d.t2d_len is not None and d.t2d_len != t_vocab:
        problems.append(f"vocab size: {label} t2d maps {d.t2d_len} target tokens, "
                        f"target has {t_vocab}")
    if d.d2t_len is not None and d.d2t_len != d.draft_vocab_size:
        problems.append(f"draft vocab: d2t has {d.d2t_len} entries, config says "
                        f"{d.draft_vocab_size}")
    # The one rule extract and train apply (contracts/target.py); a target config without
    # a layer count checks what needs none.
    # MTP reads layer N alone (the input of the final norm, through a hook): every target
    # has it.
    mtp_last = d.kind in DRAFTERS and DRAFTERS[d.kind].target_mtp and \
        d.aux_layer_ids == [t_layers]
    bad = None if mtp_last else layer_ids_problem(
        d.aux_layer_ids, t_layers if isinstance(t_layers, int) else None,
        f"{label} aux layer ids")
    if bad:
        problems.append(f"layer ids: {bad.message}")
    if problems:
        raise StageError("drafter_target_mismatch",
                         f"{label} at {d.path} does not fit the target: " + "; ".join(problems),
                         {"problems": problems})


def load_drafter(d: DrafterSpec, target_path: str | Path, device: str = "cpu",
                 dtype: Any = None) -> Any:
    """Load the checkpoint (float32 by default), with verifier weights from the resolved target.

    The verifier path recorded at training time may not exist here (artifacts move), so it
    is replaced by the target being evaluated; the fit check has already shown they agree.
    Attention runs through SDPA: flex attention is for training masks on GPUs.
    """
    from speculators import SpeculatorModel, SpeculatorModelConfig

    config = SpeculatorModelConfig.from_pretrained(str(d.path))
    _point_at_target(config, target_path)
    import torch

    model = SpeculatorModel.from_pretrained(str(d.path), config=config)
    return model.to(device=device, dtype=dtype or torch.float32).eval().requires_grad_(False)


def untrained_like(model: Any, target_path: str | Path, seed: int) -> Any:
    """The same drafter architecture with fresh seeded weights: the "untrained" baseline.

    Vocabulary maps are copied (they come from data, not training) and the frozen verifier
    weights (embeddings, head, final norm) are reloaded, as speculators does when it starts
    a run from a config alone.
    """
    import copy

    import torch

    config = copy.deepcopy(model.config)
    _point_at_target(config, target_path)
    torch.manual_seed(seed)
    fresh = type(model)(config=config)
    if getattr(model, "t2d", None) is not None:
        fresh.load_vocab_mappings(model.t2d.clone(), model.d2t.clone())
    fresh.load_verifier_weights()
    ref = next(model.parameters())
    return fresh.to(device=ref.device, dtype=ref.dtype).eval().requires_grad_(False)


def _point_at_target(config: Any, target_path: str | Path) -> None:
    config.speculators_config.verifier.name_or_path = str(target_path)
    config.transformer_layer_config._attn_implementation = "sdpa"
