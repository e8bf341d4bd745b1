"""Inputs for the train stage tests, built the way the prepare and extract stages lay them
out, but computed independently here (a plain HF forward), so the tests check the train
stage against the formats rather than against its own helpers.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

LAYER_IDS = [1, 4, 7]   # aux layers of the 8-layer tiny target
WORDS = ["alpha", "beta", "gamma", "delta"]


def build_tokenized(target_dir: Path, out: Path, rows: int = 48) -> Path:
    """A small repetitive chat set (learnable in a few dozen steps): the real Qwen3 template
    renders the prompt, the assistant turn repeats a 4-word phrase; loss on the answer."""
    import datasets
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir)
    cols: dict[str, list] = {"id": [], "input_ids": [], "loss_mask": [], "seq_len": []}
    freq: Counter[int] = Counter()
    for i in range(rows):
        w = WORDS[i % len(WORDS)]
        prompt = tok.apply_chat_template([{"role": "user", "content": f"Say {w}."}],
                                         add_generation_prompt=True, tokenize=True,
                                         enable_thinking=False)["input_ids"]
        answer = tok(" ".join([w, "one", "two", "three"] * 6) + "<|im_end|>\n",
                     add_special_tokens=False)["input_ids"]
        ids = list(prompt) + list(answer)
        mask = [0] * len(prompt) + [1] * len(answer)
        cols["id"].append(f"row{i}")
        cols["input_ids"].append(ids)
        cols["loss_mask"].append(mask)
        cols["seq_len"].append(len(ids))
        freq.update(t for t, m in zip(ids, mask, strict=True) if m)
    ds = datasets.Dataset.from_dict(cols)
    ds.set_format("torch")
    ds.save_to_disk(str(out))
    torch.save(dict(freq), out / "token_freq.pt")
    return out


def train_target(target_dir: Path, tokenized: Path, out: Path, steps: int = 60,
                 lr: float = 3e-3) -> Path:
    """A copy of the random tiny target briefly trained (next-token) on the tokenized rows.

    A random target's logits are nearly flat (std ~0.16 over its tied embedding), so the
    token it predicts flips with tiny context changes and a drafter, whose lm_head is that
    same frozen embedding, can hardly become confident: its loss falls slowly whatever it
    learns. A briefly trained target predicts the data with confidence, as real targets do
    (docs/FIELD-NOTES.md: "A random target is a poor demo"). Logits are computed over the tokens
    the rows use only, which keeps a step at a few milliseconds."""
    import shutil

    import torch
    from datasets import load_from_disk
    from transformers import AutoModelForCausalLM

    shutil.copytree(target_dir, out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    rows = load_from_disk(str(tokenized)).with_format("torch")
    seqs = sorted({tuple(r.tolist()) for r in rows["input_ids"]})
    kept = sorted({t for s in seqs for t in s})
    to_compact = {t: i for i, t in enumerate(kept)}
    emb = model.get_input_embeddings().weight
    # Only the used rows of the tied embedding train (a compact copy), so a step does not
    # touch the 151k-row table.
    rows_kept = torch.nn.Parameter(emb.detach()[torch.tensor(kept)].clone())
    body = model.model
    body.embed_tokens.weight.requires_grad_(False)
    params = [rows_kept, *(q for n, q in body.named_parameters() if "embed_tokens" not in n)]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    # The rows of one length go through the body as one batch (the chat set's rows are all
    # one length: one forward a step, not one a row); the loss is the sum of the rows' means.
    by_len: dict[int, list[list[int]]] = {}
    for s in seqs:
        by_len.setdefault(len(s), []).append([to_compact[t] for t in s])
    batches = [torch.tensor(b) for _, b in sorted(by_len.items())]
    for _ in range(steps):
        loss = torch.zeros(())
        for ids in batches:
            h = body(inputs_embeds=rows_kept[ids]).last_hidden_state[:, :-1]
            ce = torch.nn.functional.cross_entropy((h @ rows_kept.T).transpose(1, 2),
                                                   ids[:, 1:], reduction="none")
            loss = loss + ce.mean(1).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        emb[torch.tensor(kept)] = rows_kept
    model.save_pretrained(out, safe_serialization=True)
    return out


def build_hidden_states(target_dir: Path, tokenized: Path, out: Path,
                        layer_ids: list[int] = LAYER_IDS) -> Path:
    """hs_{row}.safetensors: aux layer i = HF hidden_states[i], then the input of the final
    norm (captured with a forward hook), as [seq, len(layer_ids) + 1, hidden]."""
    import torch
    from datasets import load_from_disk
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    captured: dict[str, torch.Tensor] = {}
    model.model.norm.register_forward_hook(lambda _m, a, _o: captured.__setitem__("x", a[0]))
    out.mkdir(parents=True, exist_ok=True)
    rows = load_from_disk(str(tokenized)).with_format("torch")
    done: dict[tuple[int, ...], torch.Tensor] = {}  # the chat set repeats its rows: one forward each
    with torch.no_grad():
        for i in range(len(rows)):
            ids = rows[i]["input_ids"][None]
            key = tuple(ids[0].tolist())
            if key not in done:
                o = model(input_ids=ids, output_hidden_states=True)
                done[key] = torch.stack([o.hidden_states[j][0] for j in layer_ids]
                                        + [captured["x"][0]], dim=1).contiguous()
            save_file({"hidden_states": done[key], "token_ids": ids[0].contiguous()},
                      str(out / f"hs_{i}.safetensors"))
    n = model.config.num_hidden_layers
    (out / "meta.json").write_text(json.dumps({"layer_ids": layer_ids, "last_layer_id": n}))
    return out


def train_spec(tmp: Path, target_dir: Path, tokenized: Path, hidden_states: Path | None,
               params: dict, name: str = "job") -> dict:
    from tests.stages.conftest import target_input

    job = tmp / name
    inputs = {"target": target_input(target_dir),
              "tokenized": {"path": str(tokenized), "meta": {}}}
    if hidden_states is not None:
        inputs["hidden_states"] = {"path": str(hidden_states),
                                   "meta": json.loads((hidden_states / "meta.json").read_text())}
    return {"params": params, "inputs": inputs, "out_dir": str(job / "out"),
            "work_dir": str(job / "work"), "events_path": str(job / "events.jsonl")}


def events(spec: dict, kind: str | None = None) -> list[dict]:
    p = Path(spec["events_path"])
    if not p.is_file():
        return []
    evs = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return [e for e in evs if kind is None or e["kind"] == kind]


def dflash_params(**over) -> dict:
    p = {"drafter": {"type": "dflash", "num_anchors": 64, "block_size": 8},
         "seq_length": 512, "lr": 3e-2, "epochs": 100, "max_steps": 40,
         "checkpoint_every": 10, "log_every": 5}
    p.update(over)
    return p
