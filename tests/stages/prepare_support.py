"""Helpers for the prepare tests: small real tokenizers per template family, conversations."""

from __future__ import annotations

import copy
from functools import lru_cache

# Special tokens of each template family (as in the vendors' tokenizer configs), and which of
# them are bos/eos.
FAMILIES: dict[str, dict] = {
    "chatml": {"special": ["<|im_start|>", "<|im_end|>", "<|endoftext|>"], "eos": "<|im_end|>"},
    "llama3": {"special": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                           "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"],
               "bos": "<|begin_of_text|>", "eos": "<|eot_id|>"},
    "gemma": {"special": ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"],
              "bos": "<bos>", "eos": "<eos>"},
    "phi3": {"special": ["<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>",
                         "<|end|>"], "bos": "<s>", "eos": "<|endoftext|>"},
    "harmony": {"special": ["<|startoftext|>", "<|start|>", "<|message|>", "<|channel|>",
                            "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"],
                "eos": "<|return|>"},
    "vicuna": {"special": ["<s>", "</s>"], "bos": "<s>", "eos": "</s>"},
}

TEMPLATE_FAMILY = {
    "chatml": "chatml", "qwen2_5": "chatml", "qwen3": "chatml", "qwen3_5": "chatml",
    "qwen3_6": "chatml", "qwen3_6_training_generation_tags": "chatml",
    "qwen3_2025-04_llamacpp": "chatml", "llama3_1": "llama3", "gemma2": "gemma",
    "phi3_5": "phi3", "gpt_oss": "harmony", "vicuna": "vicuna",
}

_CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello there! How are you today?",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "Paris is sunny, 22°C. Überprüfung: naïve café — 東京は晴れ。 😀👋 ∑x² ≤ 10",
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
    "You are a helpful assistant. Cutting Knowledge Date: December 2023",
    "<think>\nreasoning goes here\n</think>\n\n<tool_call>\n</tool_call>",
]


@lru_cache(maxsize=None)
def _tokenizer_json(family: str) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    tok.add_special_tokens(FAMILIES[family]["special"])
    # Qwen-style added (non-special) tokens, so the chatml family looks like Qwen's vocab
    if family == "chatml":
        tok.add_tokens(["<think>", "</think>", "<tool_call>", "</tool_call>",
                        "<tool_response>", "</tool_response>"])
    return tok.to_str()


def small_tokenizer(family: str):
    """A small byte-level BPE tokenizer (trained here) with the family's special tokens."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    f = FAMILIES[family]
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_tokenizer_json(family)),
                                   bos_token=f.get("bos"), eos_token=f.get("eos"))


def tool_call(name: str, **args) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": args}}


def rec(messages: list[dict], rid: str = "r", tools: list | None = None) -> dict:
    r = {"id": rid, "source": "test:1", "messages": copy.deepcopy(messages)}
    if tools:
        r["tools"] = tools
    return r


U, A, S, T = "user", "assistant", "system", "tool"


def m(role: str, content: str = "", **kw) -> dict:
    return {"role": role, "content": content, **kw}


def runs(mask) -> list[tuple[int, int]]:
    """Contiguous runs of 1 in a 0/1 sequence, as [start, end) pairs."""
    out, start = [], None
    for k, v in enumerate(list(mask) + [0]):
        if v and start is None:
            start = k
        elif not v and start is not None:
            out.append((start, k))
            start = None
    return out


def expected_mask(tokenizer, text: str, expected: list[str]) -> tuple[list[int], list[int]]:
    """Independent of the stage: find the hand-written expected strings in order in the text,
    tokenize the text with offsets and mark the tokens inside them. The rule for a token that
    crosses a span boundary: it is replaced by the tokens of its parts (the prompt part
    tokenized alone, then the reply part, as at inference)."""
    spans, pos = [], 0
    for e in expected:
        k = text.find(e, pos)
        assert k >= 0, f"expected span {e!r} is not in the rendering after {pos}:\n{text!r}"
        spans.append((k, k + len(e)))
        pos = k + len(e)
    bounds = sorted({x for s in spans for x in s})
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, mask = [], []
    for tid, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]):
        pts = [a] + [x for x in bounds if a < x < b] + [b]
        for x, y in zip(pts, pts[1:]):
            part = [tid] if len(pts) == 2 else \
                tokenizer(text[x:y], add_special_tokens=False)["input_ids"]
            ids += part
            mask += [int(any(s <= x and y <= e for s, e in spans))] * len(part)
    return ids, mask


def write_small_target(folder, template_text: str, family: str = "chatml"):
    """A target folder for prepare: a small real tokenizer carrying `template_text`, its
    config.json and generation_config.json (prepare never loads weights). Loads in a fraction
    of the time the 151k-token Qwen3 tokenizer takes, for tests that run the stage often."""
    import json
    from pathlib import Path

    folder = Path(folder)
    tok = small_tokenizer(family)
    tok.chat_template = template_text
    tok.save_pretrained(folder)
    eos = tok.convert_tokens_to_ids(FAMILIES[family]["eos"])
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3",
                                                    "vocab_size": len(tok)}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return folder


def rows_to_batch(ids: list[str], input_ids: list, loss_masks: list):
    """A tokenized record batch from per-row arrays (what prepare's pool builds from its
    workers' flat arrays: workers/stages/prepare/pool.py)."""
    from workers.stages.prepare.writer import flat_to_batch, flatten_rows

    return flat_to_batch(ids, *flatten_rows(input_ids, loss_masks))
