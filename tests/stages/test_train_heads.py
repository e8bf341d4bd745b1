"""The drafter's embedding and logits heads are the target's (workers/stages/train/heads.py):
on a tiny tied-embedding Llama target (SmolLM2's shape: no `lm_head.weight` stored), on an
untied one, and a drafter whose head is wrong is refused before any step is spent on it."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from tests.stages import train_support as ts
from workers.stages.common import StageContext, StageError


@pytest.fixture(scope="module")
def llama_targets(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """{"tied"|"untied": (target, tokenized set)}: tiny Llama targets with the Qwen3
    tokenizer (4 layers keep them small) and the train tests' repetitive chat set."""
    from workers.stages.tinymodel import build_tiny_target

    base = tmp_path_factory.mktemp("llama_heads")
    out = {}
    for name, tied in (("tied", True), ("untied", False)):
        target = build_tiny_target(base / name, arch="llama", layers=4, tied=tied, seed=3)
        out[name] = (target, ts.build_tokenized(target, base / f"tok_{name}", rows=8))
    return out


def _target_heads(target: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(input embedding, logits head) as transformers loads the target: independent of the
    stage's own reading of the files."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    return (model.get_input_embeddings().weight.detach(),
            model.get_output_embeddings().weight.detach())


@pytest.fixture(scope="module")
def target_heads():
    """`_target_heads`, each target loaded once for this module (its tests only read them)."""
    return functools.cache(_target_heads)


def _job(tmp: Path, target: Path, tok: Path, **params):
    from tests.stages.typed import train_job

    p = ts.dflash_params(max_steps=2, seq_length=256, **params)
    p["drafter"]["target_layer_ids"] = [1, 2]
    spec = ts.train_spec(tmp, target, tok, None, {**p, "mode": "online"})
    return spec, train_job(spec, "hf")


def test_tied_llama_target_safetensors_hold_no_lm_head(llama_targets):
    from safetensors import safe_open

    target, _ = llama_targets["tied"]
    with safe_open(str(target / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys


def test_trained_drafter_head_is_the_tied_embedding_on_the_draft_vocab(llama_targets,
                                                                       target_heads, tmp_path):
    """The train stage end to end (online HF hidden states, 2 steps): the saved drafter's
    lm_head holds the target's embedding rows of the draft vocabulary, in d2t order, and a
    reload rebuilds verifier_lm_head and embed_tokens from the target the same way."""
    from speculators.model import SpeculatorModel

    from tests.stages.typed import run_stage

    target, tok = llama_targets["tied"]
    spec, _ = _job(tmp_path, target, tok, drafter={"type": "dflash", "num_anchors": 16,
                                                   "block_size": 4, "draft_vocab_size": 64})
    ctx = StageContext.from_spec(spec)
    try:
        summary = run_stage("train", spec, ctx)
    finally:
        ctx.close()
    assert summary["steps"] == 2
    embed, head = target_heads(target)
    assert torch.equal(embed, head)  # tied
    drafter = SpeculatorModel.from_pretrained(str(Path(spec["out_dir"]) / "drafter"))
    ids = torch.arange(64) + drafter.d2t          # draft row i is target token i + d2t[i]
    assert torch.equal(drafter.t2d.nonzero().flatten(), ids)
    assert torch.equal(drafter.lm_head.weight, head[ids])
    assert torch.equal(drafter.verifier_lm_head.weight, head[ids])
    assert torch.equal(drafter.embed_tokens.weight, embed)


def test_untied_target_head_is_its_own_lm_head(llama_targets, target_heads, tmp_path):
    from workers.stages.train import build, heads

    target, tok = llama_targets["untied"]
    embed, head = target_heads(target)
    assert not torch.equal(embed, head)
    _spec, job = _job(tmp_path, target, tok, drafter={"type": "dflash", "num_anchors": 16,
                                                      "block_size": 4,
                                                      "draft_vocab_size": None})
    model = build.build_model(job)
    assert torch.equal(model.lm_head.weight, head)
    assert heads.check_drafter_heads(model, target, warn=print) == {
        "draft_rows": head.shape[0], "vocab": head.shape[0]}


@pytest.mark.parametrize("wrong", ["embedding_for_untied_head", "rows_out_of_d2t_order"])
def test_a_wrong_head_is_refused_by_the_train_stage(llama_targets, target_heads, tmp_path,
                                                   wrong):
    """What the check exists for: a head that is the embedding of an untied target (the
    fallback speculators takes when it finds no `lm_head.weight`), or the right rows in
    another order than d2t's. The stage stops with `drafter_head_mismatch`."""
    from workers.stages.train import build, heads

    name = "untied" if wrong == "embedding_for_untied_head" else "tied"
    target, tok = llama_targets[name]
    embed, head = target_heads(target)
    vocab = None if name == "untied" else 64
    _spec, job = _job(tmp_path, target, tok, drafter={"type": "dflash", "num_anchors": 16,
                                                      "block_size": 4,
                                                      "draft_vocab_size": vocab})
    model = build.build_model(job)
    heads.check_drafter_heads(model, target, warn=print)  # as built: right
    with torch.no_grad():
        if name == "untied":
            model.lm_head.weight.copy_(embed)
        else:
            model.verifier_lm_head.weight.copy_(model.verifier_lm_head.weight.flip(0))
    with pytest.raises(StageError) as e:
        heads.check_drafter_heads(model, target, warn=print)
    assert e.value.code == "drafter_head_mismatch"
    assert ("lm_head" if name == "untied" else "verifier_lm_head") in e.value.message
