"""The demo target: varied (non-degenerate) greedy output, and a deterministic build."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import pytest
import torch

from workers.stages.demo_target import (
    DEMO_META_FILE,
    DemoTargetConfig,
    build_demo_target,
    stdlib_corpus,
)

PROMPTS = ["Write a function that parses a config file.", "How do I sort a list of dicts?",
           "Explain what a context manager is.", "class Stack:"]


def _greedy(model_dir, n_new=64):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    outs = []
    for q in PROMPTS:
        text = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                       add_generation_prompt=True, enable_thinking=False)
        ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n_new, do_sample=False, top_p=None,
                                 top_k=None, temperature=None)
        outs.append(out[0, ids.shape[1]:].tolist())
    return tok, outs


def test_demo_target_greedy_output_is_varied_code(demo_target):
    tok, outs = _greedy(demo_target)
    # A random tiny target repeats one token 64 times; this one writes code. A briefly
    # trained tiny model still falls into a loop on some prompts (e.g. a run of "0"s after a
    # comment), so most, not all, outputs must be richly varied.
    counts = [Counter(out) for out in outs]
    assert all(len(c) > 8 for c in counts), [tok.decode(o) for o in outs]
    rich = [c for c in counts if len(c) >= 16 and c.most_common(1)[0][1] <= 0.4 * 64]
    assert len(rich) >= 3, [tok.decode(o) for o in outs]
    text = "".join(tok.decode(o) for o in outs)
    assert sum(text.count(c) for c in "()\n:=") >= 40  # code punctuation, not prose
    assert len({tuple(o) for o in outs}) >= 2  # the prompt matters
    meta = json.loads((demo_target / DEMO_META_FILE).read_text())
    assert meta["loss_last10"] < meta["loss_first"] - 3.0  # it learned something


def test_random_tiny_target_is_degenerate_by_contrast(tiny_target):
    """Why the demo target exists: the random one repeats itself."""
    _, outs = _greedy(tiny_target, n_new=24)
    assert all(len(set(o)) <= 3 for o in outs)


def _digest(folder) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def test_demo_build_is_deterministic_for_a_seed(tmp_path):
    """Two builds with one seed give the same bytes (a short config: same code path)."""
    cfg = DemoTargetConfig(steps=6, batch=2, seq_len=32, corpus_bytes=40_000, warmup=2)
    a = build_demo_target(tmp_path / "a", cfg)
    b = build_demo_target(tmp_path / "b", cfg)
    assert _digest(a) == _digest(b)
    ma, mb = (json.loads((x / DEMO_META_FILE).read_text()) for x in (a, b))
    assert ma["loss_first"] == mb["loss_first"] and ma["loss_last10"] == mb["loss_last10"]
    assert ma["loss_last10"] < ma["loss_first"]  # it trained: the bytes are not the init
    assert ma["kept_tokens"] >= 1024
    # Tokens outside the compact vocabulary share one row after the copy-back.
    from safetensors import safe_open

    with safe_open(str(a / "model.safetensors"), "pt") as f:
        emb = f.get_tensor("model.embed_tokens.weight")
    assert emb.shape[0] == 151669
    assert torch.equal(emb[150000], emb[151000])  # two rare tokens, same row


def test_corpus_is_stable_and_bounded():
    text, files = stdlib_corpus(50_000)
    text2, _ = stdlib_corpus(50_000)
    assert text == text2 and len(text) == 50_000
    assert files == sorted(files) and all(f.endswith(".py") for f in files)


@pytest.mark.parametrize("bad", [{"steps": 0}, {"arch": "qwen3_5"}])
def test_bad_config_is_refused(bad):
    with pytest.raises(ValueError):
        DemoTargetConfig(**bad)
