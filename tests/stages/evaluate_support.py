"""Test helpers for the evaluate stage: real drafters for tiny targets.

Until the `train` stage lands, a trained drafter for the tests comes from a minimal loop around
speculators' own pieces: its model classes (`DFlashDraftModel.from_training_args`), its loss
(`get_trainer_kwargs` with CE + D-PACE weighting), its optimizer split (Muon for matrices,
AdamW for the rest) and its checkpoint format (`save_pretrained`). The data is the target's
own greedy answers, as a draftyard run would produce with generate -> prepare -> extract.
"""

from __future__ import annotations

import json
import random
import sysconfig
from pathlib import Path
from types import SimpleNamespace

import torch

MASK_TOKEN = "<|endoftext|>"  # the Qwen3 tokenizer has no spare slot (docs/FIELD-NOTES.md)


def code_prompts(n: int, seed: int = 0) -> list[str]:
    """`n` distinct user prompts: short lines of stdlib packages (not the demo corpus files)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    lines: list[str] = []
    for pkg in ("json", "email", "http", "logging", "unittest", "importlib", "xml", "concurrent"):
        for f in sorted((root / pkg).rglob("*.py")):
            for line in f.read_text(encoding="utf-8", errors="replace").splitlines():
                s = line.strip()
                if 24 <= len(s) <= 90 and not s.startswith("#"):
                    lines.append(s)
    uniq = sorted(set(lines))
    random.Random(seed).shuffle(uniq)
    return [f"Continue this Python code:\n{s}" for s in uniq[:n]]


def render_prompts(tokenizer, texts: list[str]) -> list[list[int]]:
    out = []
    for t in texts:
        s = tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                          add_generation_prompt=True, enable_thinking=False)
        out.append(tokenizer(s, add_special_tokens=False)["input_ids"])
    return out


def greedy_rows(model, prompts: list[list[int]], max_new: int,
                batch: int = 32) -> list[tuple[list[int], list[int]]]:
    """(prompt + greedy answer ids, loss mask on the answer) for each prompt, batched."""
    rows = []
    pad = 0
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        att = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=att, do_sample=False, max_new_tokens=max_new,
                                 pad_token_id=pad, top_p=None, top_k=None, temperature=None)
        for p, o in zip(chunk, out[:, width:].tolist(), strict=True):
            rows.append((p + o, [0] * len(p) + [1] * len(o)))
    return rows


def make_drafter(target_dir: Path, kind: str = "dflash", *,
                 rows=None, draft_vocab: int = 2048, block_size: int = 8, layers: int = 1,
                 aux: tuple[int, ...] = (1, 4, 7), ttt_steps: int = 4, seed: int = 0,
                 mask_token_id: int | None = None):
    """An untrained speculators drafter for `target_dir` (model object, not yet saved).

    The draft vocabulary comes from token frequencies over `rows`' masked tokens (what the
    prepare stage writes), or from the first ids when no rows are given.
    """
    from speculators.models.dflash import DFlashDraftModel
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.cli import create_transformer_layer_config
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution
    from transformers import AutoConfig, AutoTokenizer

    vocab = AutoConfig.from_pretrained(target_dir).vocab_size
    freq: dict[int, int] = {}
    for ids, mask in rows or []:
        for t, m in zip(ids, mask, strict=True):
            if m:
                freq[t] = freq.get(t, 0) + 1
    d2t, t2d = build_vocab_mappings_from_distribution(freq or {0: 1}, draft_vocab, vocab)
    layer_cfg = create_transformer_layer_config(str(target_dir), layers, "qwen3", None, 0,
                                                list(range(layers)))
    torch.manual_seed(seed)
    common = {"t2d": t2d, "d2t": d2t, "draft_vocab_size": draft_vocab,
              "target_layer_ids": list(aux), "verifier_name_or_path": str(target_dir),
              "draft_attn_impl": "sdpa"}
    if kind == "dflash":
        mask_id = mask_token_id if mask_token_id is not None else \
            AutoTokenizer.from_pretrained(target_dir).convert_tokens_to_ids(MASK_TOKEN)
        model = DFlashDraftModel.from_training_args(layer_cfg, block_size=block_size,
                                                    mask_token_id=mask_id, **common)
    else:
        model = Eagle3DraftModel.from_training_args(layer_cfg, norm_before_residual=True,
                                                    ttt_steps=ttt_steps, **common)
    return model


def target_features(model, ids: list[int], aux: tuple[int, ...]):
    """(aux hidden states [T, L*H], pre-final-norm last hidden [T, H]) of one row."""
    cap = {}
    h = model.get_decoder().norm.register_forward_pre_hook(
        lambda _m, a: cap.__setitem__("x", a[0]))
    try:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), output_hidden_states=True,
                        logits_to_keep=1)
    finally:
        h.remove()
    n = model.config.num_hidden_layers
    parts = [cap["x"] if i == n else out.hidden_states[i] for i in aux]
    return torch.cat(parts, dim=-1)[0], cap["x"][0]


def train_dflash(drafter, target_model, rows, steps: int, *, aux: tuple[int, ...] = (1, 4, 7),
                 packed_len: int = 1024, max_anchors: int = 128, lr: float = 1e-2,
                 seed: int = 0) -> list[float]:
    """Train `drafter` in place on packed rows; returns the loss per step.

    One forward of the target per row up front (offline mode); each step packs random rows
    up to `packed_len` tokens with document ids, as speculators' collate does.
    """
    from speculators.train.optimizers import build_optimizers

    feats = [target_features(target_model, ids, aux) for ids, _ in rows]
    train_kw, _ = type(drafter).get_trainer_kwargs(
        loss_fn="ce", loss_implementation="eager", per_position_loss_weight="dpace",
        max_anchors=max_anchors)
    opt_cfg = SimpleNamespace(optimizer="muon", lr=lr, weight_decay=0.0, muon_lr=lr,
                              muon_momentum=0.95, muon_weight_decay=0.0, muon_ns_steps=5,
                              muon_adjust_lr_fn="match_rms_adamw")
    opts = build_optimizers(drafter, opt_cfg)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    drafter.train()
    losses = []
    for _ in range(steps):
        order = rng.sample(range(len(rows)), len(rows))
        hs, last, ids, mask, doc = [], [], [], [], []
        used = 0
        for d, i in enumerate(order):
            n = len(rows[i][0])
            if used + n > packed_len:
                break
            hs.append(feats[i][0])
            last.append(feats[i][1])
            ids.append(torch.tensor(rows[i][0]))
            mask.append(torch.tensor(rows[i][1]))
            doc.append(torch.full((n,), d))
            used += n
        pos = torch.cat([torch.arange(len(x)) for x in ids])
        _, loss, _ = drafter(
            hidden_states=torch.cat(hs)[None], input_ids=torch.cat(ids)[None],
            loss_mask=torch.cat(mask)[None], verifier_last_hidden_states=torch.cat(last)[None],
            document_ids=torch.cat(doc)[None], position_ids=pos[None], **train_kw)
        for o in opts:
            o.zero_grad(set_to_none=True)
        loss.backward()
        for o in opts:
            o.step()
        losses.append(float(loss.detach()))
    drafter.eval()
    return losses


def save(drafter, out_dir: Path) -> Path:
    drafter.save_pretrained(out_dir)
    return out_dir


def write_tokenized(folder: Path, rows, meta: dict | None = None) -> Path:
    """Rows as a tokenized artifact in the layout speculators reads (HF save_to_disk)."""
    from datasets import Dataset

    folder.mkdir(parents=True, exist_ok=True)
    Dataset.from_dict({"input_ids": [r[0] for r in rows], "loss_mask": [r[1] for r in rows],
                       "seq_len": [len(r[0]) for r in rows]}).save_to_disk(str(folder / "data"))
    (folder / "meta.json").write_text(json.dumps(meta or {}))
    return folder
