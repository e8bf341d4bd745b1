"""The generate stage with the transformers backend on tiny real Qwen3 targets."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.stages.conftest import target_input
from tests.stages.generate_support import events, make_spec, read_output, run_stage
from workers.stages.common import StageError
from workers.stages.generate.render import split_reasoning

MAX_NEW = 12
RECORDS = [
    {"id": "u1", "source": "t:1", "messages": [
        {"role": "user", "content": "Write a function that reverses a string."}]},
    {"id": "s1", "source": "t:2", "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is a monad?"},
        {"role": "assistant", "content": "A burrito."}]},
    {"id": "m1", "source": "t:3", "messages": [
        {"role": "system", "content": "Be helpful."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ORIGINAL ANSWER ONE"},
        {"role": "user", "content": "Now explain recursion with an example in Python."},
        {"role": "assistant", "content": "ORIGINAL ANSWER TWO"}]},
    {"id": "m2", "source": "t:4", "messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "ORIGINAL FOUR"},
        {"role": "user", "content": "and 3+3?"}]},
]
NO_THINK = {"enable_thinking": False}


@pytest.fixture(scope="module")
def varied_target(tiny_target, tmp_path_factory) -> Path:
    """The tiny Qwen3 target with its linear layers re-drawn at unit gain. The stock random
    init (std 0.02) makes greedy output one token repeated; unit-gain weights give varied
    sequences, so equality with plain `generate` means something."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("varied_qwen3")
    model = AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.normal_(0.0, p.shape[1] ** -0.5, generator=gen)
    model.save_pretrained(out)
    # The tokenizer's files as they are (loading the tokenizer to save it again costs a CPU-s).
    for f in tiny_target.iterdir():
        if not (out / f.name).exists():
            shutil.copy(f, out / f.name)
    return out


@pytest.fixture(scope="module")
def tokenizer(tiny_target):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_target)


@pytest.fixture(scope="module")
def greedy_run(varied_target, tmp_path_factory):
    spec = make_spec(tmp_path_factory.mktemp("greedy"), RECORDS, target_input(varied_target),
                     max_tokens=MAX_NEW, batch_size=3, chat_template_kwargs=NO_THINK)
    return spec, run_stage(spec)


def _prompt_ids(tok, messages, **kw) -> list[int]:
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kw)
    return tok(text, add_special_tokens=False)["input_ids"]


def test_regenerates_user_only_system_and_multi_turn(greedy_run, tokenizer):
    spec, result = greedy_run
    recs, toks, fails, meta = read_output(spec)
    assert fails == [] and result["num_failed"] == 0
    assert set(recs) == {r["id"] for r in RECORDS} and result["num_records"] == 4
    for src in RECORDS:
        out = recs[src["id"]]
        assert out["source"] == src["source"]
        want_len = len(src["messages"]) + (src["messages"][-1]["role"] == "user")
        assert len(out["messages"]) == want_len
        for i, m in enumerate(out["messages"]):
            if i < len(src["messages"]) and src["messages"][i]["role"] != "assistant":
                assert m == src["messages"][i]  # system and user turns kept as they were
                continue
            assert m["role"] == "assistant"
            assert not m["content"].startswith("ORIGINAL")
            t = toks[(src["id"], i)]
            # The content is exactly the decoded generated ids (thinking off: no reasoning).
            text = tokenizer.decode(t["completion_ids"], skip_special_tokens=True)
            assert "reasoning" not in m and m["content"] == text and text.strip()
            assert split_reasoning(text, False) == (None, text)
            # Turn by turn: the prompt is the template over the output so far, so the
            # target's own earlier answers are the history.
            assert t["prompt_ids"] == _prompt_ids(tokenizer, out["messages"][:i], **NO_THINK)
            assert t["finish_reason"] in ("stop", "length")
            assert len(t["completion_ids"]) <= MAX_NEW
    assert sorted(k for k in toks if k[0] == "m1") == [("m1", 2), ("m1", 4)]
    second_prompt = tokenizer.decode(toks[("m1", 4)]["prompt_ids"])
    assert "ORIGINAL ANSWER ONE" not in second_prompt
    assert recs["m1"]["messages"][2]["content"] in second_prompt
    assert meta["tokens_generated"] == sum(len(t["completion_ids"]) for t in toks.values())
    assert meta["num_records"] + meta["num_failed"] == len(RECORDS)
    g = meta["generation"]
    assert g["backend"] == "hf" and g["chat_template_kwargs"] == NO_THINK
    assert g["chat_template_sha256"] == hashlib.sha256(
        tokenizer.chat_template.encode()).hexdigest()
    assert (g["temperature"], g["top_p"], g["max_tokens"], g["seed"]) == (0.0, 1.0, MAX_NEW, 0)
    folder = Path(spec["out_dir"]) / "dataset"
    assert (folder / "chat_template.jinja").read_text() == tokenizer.chat_template
    ev = events(spec)
    prog = [e["data"] for e in ev if e["kind"] == "progress"]
    assert prog[-1] == {"stage": "generate", "done": 4, "total": 4, "unit": "records"}
    art = [e["data"] for e in ev if e["kind"] == "artifact"]
    assert art == [{"name": "dataset", "kind": "dataset", "path": "dataset", "meta": meta}]


def test_greedy_equals_plain_generate(greedy_run, varied_target):
    """Batched, length-sorted, left-padded generation gives the tokens a plain
    one-prompt `model.generate` gives."""
    import torch
    from transformers import AutoModelForCausalLM

    spec, _ = greedy_run
    _, toks, _, _ = read_output(spec)
    model = AutoModelForCausalLM.from_pretrained(varied_target, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    distinct = set()
    for t in toks.values():
        with torch.inference_mode():
            out = model.generate(torch.tensor([t["prompt_ids"]]), do_sample=False,
                                 max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=eos)
        ref = out[0, len(t["prompt_ids"]):].tolist()
        assert t["completion_ids"] == ref
        distinct.update(ref)
    assert len(distinct) > 10  # varied output, not one token repeated


def test_last_turn_only_keeps_earlier_answers(varied_target, tokenizer, tmp_path):
    spec = make_spec(tmp_path, RECORDS[2:], target_input(varied_target), turns="last",
                     max_tokens=4, chat_template_kwargs=NO_THINK)
    run_stage(spec)
    recs, toks, _, _ = read_output(spec)
    assert recs["m1"]["messages"][:4] == RECORDS[2]["messages"][:4]
    assert recs["m1"]["messages"][4]["content"] != "ORIGINAL ANSWER TWO"
    assert recs["m2"]["messages"][:3] == RECORDS[3]["messages"]  # answer appended after u
    assert sorted(toks) == [("m1", 4), ("m2", 3)]
    assert "ORIGINAL ANSWER ONE" in tokenizer.decode(toks[("m1", 4)]["prompt_ids"])


def test_thinking_on_and_off_prompts(tiny_target, tokenizer, tmp_path):
    """Qwen3: thinking off puts an empty think block into the prompt; on leaves the block to
    the model. The prompt ids handed to the model differ by exactly that block."""
    recs = RECORDS[:2]
    runs = {}
    # "off" comes from the target's own kwargs here (the params' override is tested below).
    for name, target in (("on", target_input(tiny_target)),
                         ("off", target_input(tiny_target, chat_template_kwargs=NO_THINK))):
        spec = make_spec(tmp_path / name, recs, target, max_tokens=3)
        run_stage(spec)
        runs[name] = read_output(spec)
    block = tokenizer("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"]
    gen_prompt = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    for key in (("u1", 1), ("s1", 2)):
        on, off = runs["on"][1][key]["prompt_ids"], runs["off"][1][key]["prompt_ids"]
        assert on[-len(gen_prompt):] == gen_prompt
        assert off == on + block
    assert runs["on"][3]["generation"]["chat_template_kwargs"] == {}
    assert runs["off"][3]["generation"]["chat_template_kwargs"] == NO_THINK


def test_template_and_kwargs_precedence(tokenizer, templates_dir):
    """params override > target override > the tokenizer's own; kwargs merge, params win."""
    from contracts.resolved import ResolvedTarget
    from workers.stages.generate.render import PromptRenderer

    chatml = (templates_dir / "chatml.jinja").read_text()
    r = PromptRenderer.for_target(tokenizer, ResolvedTarget(path="t", chat_template=None,
                                                            chat_template_kwargs={"a": 1, "b": 1}),
                                  None, {"b": 2})
    assert r.template == tokenizer.chat_template and r.kwargs == {"a": 1, "b": 2}
    r = PromptRenderer.for_target(tokenizer, ResolvedTarget(path="t", chat_template=chatml),
                                  None, {})
    assert r.template == chatml
    assert r.render([{"role": "user", "content": "x"}]).endswith("<|im_start|>assistant\n")
    qwen25 = (templates_dir / "qwen2_5.jinja").read_text()
    r = PromptRenderer.for_target(tokenizer, ResolvedTarget(path="t", chat_template=chatml),
                                  qwen25, {})
    assert r.template == qwen25 and r.sha256 == hashlib.sha256(qwen25.encode()).hexdigest()
    assert "You are Qwen" in r.render([{"role": "user", "content": "x"}])


def test_stop_strings_end_answers(varied_target, tokenizer, tmp_path, greedy_run):
    """A stop string taken from the middle of a greedy answer ends that answer right after
    it (kept in the text, as vLLM's include_stop_str_in_output does)."""
    recs, _, _, _ = read_output(greedy_run[0])
    full = recs["u1"]["messages"][1]["content"]
    stop = full[len(full) // 2: len(full) // 2 + 2]
    spec = make_spec(tmp_path / "stop", RECORDS[:1], target_input(varied_target), stop=[stop],
                     max_tokens=MAX_NEW, chat_template_kwargs=NO_THINK)
    run_stage(spec)
    recs2, toks2, _, _ = read_output(spec)
    got = recs2["u1"]["messages"][1]["content"]
    assert stop in got and full.startswith(got) and len(got) < len(full)
    ids = toks2[("u1", 1)]["completion_ids"]
    assert stop not in tokenizer.decode(ids[:-1], skip_special_tokens=True)  # the first one
    assert toks2[("u1", 1)]["finish_reason"] == "stop"
    assert got == tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.slow
def test_sampling_is_seeded(varied_target, tmp_path):
    target = target_input(varied_target)
    outs = []
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        spec = make_spec(tmp_path / name, RECORDS[:2], target, temperature=1.0, top_p=0.9,
                         seed=seed, max_tokens=6, chat_template_kwargs=NO_THINK)
        run_stage(spec)
        outs.append({k: t["completion_ids"] for k, t in read_output(spec)[1].items()})
    assert outs[0] == outs[1] and outs[0] != outs[2]


def test_failures_are_recorded_and_budgeted(tiny_target, tmp_path):
    recs = [*RECORDS[:2],
            {"id": "long", "source": "t:9", "messages": [
                {"role": "user", "content": "word " * 200}]},
            {"id": "sys_only", "source": "t:10", "messages": [
                {"role": "system", "content": "nobody asks"}]}]
    spec = make_spec(tmp_path / "ok", recs, target_input(tiny_target), max_tokens=2,
                     max_prompt_tokens=64, max_failure_share=0.5)
    result = run_stage(spec)
    out, _, fails, meta = read_output(spec)
    assert set(out) == {"u1", "s1"}
    assert {f["id"]: f["reason"] for f in fails} == {"long": "prompt_too_long",
                                                      "sys_only": "nothing_to_generate"}
    assert meta["failed_by_reason"] == {"prompt_too_long": 1, "nothing_to_generate": 1}
    assert result["num_records"] + result["num_failed"] == len(recs)
    spec = make_spec(tmp_path / "strict", recs, target_input(tiny_target), max_tokens=2,
                     max_prompt_tokens=64, max_failure_share=0.25)
    with pytest.raises(StageError) as e:
        run_stage(spec)
    assert e.value.code == "too_many_failures"
    # The error names the records, their input lines, reasons and messages ...
    d = e.value.details
    assert d["num_failed"] == 2 and d["failed"] == 2 and d["total"] == 4
    assert d["failed_by_reason"] == {"prompt_too_long": 1, "nothing_to_generate": 1}
    by_id = {f["id"]: f for f in d["failed_sample"]}
    assert (by_id["long"]["line"], by_id["long"]["reason"]) == (9, "prompt_too_long")
    assert "> limit 64" in by_id["long"]["message"]
    assert (by_id["sys_only"]["line"], by_id["sys_only"]["reason"]) == (10, "nothing_to_generate")
    assert "no assistant turn to answer" in by_id["sys_only"]["message"]
    assert "long (prompt_too_long)" in e.value.message
    # ... and the full list stays in the job's folder although the job failed.
    listed = [json.loads(x) for x in Path(d["failures_file"]).read_text().splitlines()]
    assert Path(d["failures_file"]).is_relative_to(spec["work_dir"])
    assert {f["id"] for f in listed} == {"long", "sys_only"}


def test_invalid_params_and_inputs(tiny_target, tmp_path):
    spec = make_spec(tmp_path, RECORDS[:1], target_input(tiny_target), temperature=-1)
    with pytest.raises(StageError) as e:
        run_stage(spec)
    assert e.value.code == "invalid_params" and "temperature" in e.value.message
    spec["params"] = {"backend": "hf"}
    spec["inputs"]["dataset"] = {"path": str(tmp_path / "nowhere")}
    with pytest.raises(StageError) as e:
        run_stage(spec)
    assert e.value.code == "invalid_input"
    assert e.value.details["errors"][0]["field"] == "inputs.dataset.path"


def test_qwen36_hybrid_target_thinking_template(tiny_target_q35, tmp_path):
    """The seeds' family in miniature: gated-delta-net hybrid + the Qwen3.6 template, whose
    generation prompt opens a think block, so the answer starts as reasoning."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_target_q35)
    recs = [RECORDS[0], RECORDS[3],
            {"id": "late_sys", "source": "t:5", "messages": [
                {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "system", "content": "late"}, {"role": "user", "content": "c"}]}]
    spec = make_spec(tmp_path / "think", recs, target_input(tiny_target_q35), max_tokens=5,
                     temperature=1.0, seed=3, max_failure_share=0.5)
    run_stage(spec)
    out, toks, fails, meta = read_output(spec)
    # The 3.6 template refuses a late system turn: a per-record failure, not a crash.
    assert [(f["id"], f["reason"]) for f in fails] == [("late_sys", "template_error")]
    assert "System message must be at the beginning" in fails[0]["message"]
    think_open = tok("<|im_start|>assistant\n<think>\n", add_special_tokens=False)["input_ids"]
    for (rid, turn), t in toks.items():
        assert t["prompt_ids"][-len(think_open):] == think_open
        msg = out[rid]["messages"][turn]
        text = tok.decode(t["completion_ids"], skip_special_tokens=True)
        assert split_reasoning(text, True) == (msg.get("reasoning"), msg["content"])
        assert t["prompt_ids"] == _prompt_ids(tok, out[rid]["messages"][:turn])
    assert sorted(toks) == [("m2", 1), ("m2", 3), ("u1", 1)]
    assert meta["generation"]["chat_template_sha256"] == hashlib.sha256(
        tok.chat_template.encode()).hexdigest()
    # Thinking off: the 3.6 template closes an empty block in the prompt instead.
    spec = make_spec(tmp_path / "nothink", recs[:1], target_input(tiny_target_q35),
                     max_tokens=3, temperature=1.0, chat_template_kwargs=NO_THINK)
    run_stage(spec)
    _, toks_off, _, _ = read_output(spec)
    closed = tok("<|im_start|>assistant\n<think>\n\n</think>\n\n",
                 add_special_tokens=False)["input_ids"]
    off = toks_off[("u1", 1)]["prompt_ids"]
    assert off[-len(closed):] == closed
    assert off[:-len(closed)] == toks[("u1", 1)]["prompt_ids"][:-len(think_open)]
