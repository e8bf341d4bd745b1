"""Check that a freshly built drafter borrowed the target's embedding and logits head.

speculators' `load_verifier_weights` (speculators/model.py) finds the target's tensors by
name: `embed_tokens.weight` and `lm_head.weight`, by exact key, then the shortest key with
that suffix, then a few aliases, and falls back to the embedding when no `lm_head.weight`
is stored. That fallback is right for a tied-embedding target (SmolLM2, the tiny Qwen3s:
`tie_word_embeddings`, no `lm_head.weight` in the file; it logs "lm_head.weight not found
in weight_map") and silently wrong for an untied target whose head is stored under another
name. A wrong head leaves no mark on the loss that a threshold could catch: measured on
SmolLM2 (one regenerated answer, DFlash defaults), the right head gave a first loss of 18.9
at a draft vocabulary of 2,048 (ln 2,048 = 7.6) and 22.8 at the full 49,152 (ln = 10.8), a
random or zero head 2.1 to 3.1: a wrong head sits *below* ln(draft vocab), not above. So
the stage compares the tensors instead, with the names transformers itself gives the
target's input and output embeddings (a meta-device build of the target's architecture: no
weights are allocated).
"""

from __future__ import annotations

import json
from pathlib import Path

from workers.stages.common import StageError


def _weight_map(target_path: Path) -> dict[str, str]:
    """{tensor name: safetensors file} of a local target folder ({} when it has none)."""
    index = target_path / "model.safetensors.index.json"
    if index.is_file():
        return dict(json.loads(index.read_text())["weight_map"])
    single = target_path / "model.safetensors"
    if not single.is_file():
        return {}
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as f:
        return dict.fromkeys(f.keys(), single.name)


def embedding_names(target_path: str | Path) -> tuple[list[str], list[str], bool]:
    """(names of the input embedding's weight, names of the output embedding's weight,
    tied?) as transformers builds the target; a tied target lists both names for both."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(target_path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    inp = model.get_input_embeddings().weight
    out = model.get_output_embeddings().weight
    named = list(model.named_parameters(remove_duplicate=False))
    return ([n for n, p in named if p is inp], [n for n, p in named if p is out], out is inp)


def target_heads(target_path: str | Path):
    """(input embedding, output embedding) tensors of the target as transformers would load
    them, or None when the target's files do not name them (then nothing can be checked)."""
    from safetensors import safe_open

    base = Path(target_path)
    wmap = _weight_map(base)
    inp_names, out_names, _tied = embedding_names(base)
    found = []
    for names in (inp_names, out_names):
        key = next((n for n in names if n in wmap), None)
        if key is None:
            return None
        with safe_open(str(base / wmap[key]), framework="pt") as f:
            found.append(f.get_tensor(key))
    return found[0], found[1]


def check_drafter_heads(model, target_path: str | Path, warn) -> dict | None:
    """Raise `drafter_head_mismatch` unless the drafter's embedding is the target's input
    embedding and its logits heads (`lm_head`, `verifier_lm_head`) are the target's output
    embedding restricted to the draft vocabulary (rows where t2d is set, in id order: d2t's
    order). Returns what was compared, or None (with a warning) when the target's files do
    not hold tensors under transformers' names."""
    import torch

    heads = target_heads(target_path)
    if heads is None:
        warn("cannot verify the drafter's logits head: the target's files hold no tensor "
             "under transformers' names for its embeddings")
        return None
    embed, out = heads
    t2d = getattr(model, "t2d", None)
    rows = out if t2d is None or not bool(t2d.any()) else out[t2d.to(torch.bool).cpu()]
    checks = {"embed_tokens": (model.embed_tokens.weight, embed),
              "lm_head": (model.lm_head.weight, rows)}
    if hasattr(model, "verifier_lm_head"):  # MTP drops it (its loss reads the tokens)
        checks["verifier_lm_head"] = (model.verifier_lm_head.weight, rows)
    for name, (have, want) in checks.items():
        have = have.detach().cpu()
        if have.shape != want.shape or not torch.equal(have, want.to(have.dtype)):
            raise StageError(
                "drafter_head_mismatch", f"the drafter's {name} is not the target's "
                f"{'input embedding' if name == 'embed_tokens' else 'output embedding'}"
                f"{'' if name == 'embed_tokens' or t2d is None else ' on the draft vocabulary'}"
                f" (shape {tuple(have.shape)} vs {tuple(want.shape)}): its drafts would be "
                "scored against the wrong logits", details={"tensor": name,
                                                            "target": str(target_path)})
    return {"draft_rows": int(rows.shape[0]), "vocab": int(out.shape[0])}
