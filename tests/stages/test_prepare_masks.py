"""Loss masks on the real fixture templates against hand-written expected assistant spans.

Each case renders a real conversation (system prompt, reasoning, a tool call with its result,
unicode, content with surrounding whitespace, an empty content) and compares the stage's mask
token for token with a mask computed independently from hand-written strings: what the model
produces in each trained turn, end-of-turn token included, nothing of the prompt.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.stages.prepare_support import (
    TEMPLATE_FAMILY, A, S, T, U, expected_mask, m, rec, runs, small_tokenizer, tool_call,
)

from workers.stages.prepare.masks import build_masker, tokenize_batch
from workers.stages.prepare.spans import RecordRejected

NOW = datetime(2025, 3, 14, tzinfo=timezone.utc)

# system prompt, reasoning, whitespace around content, unicode, a tool call with empty
# content and its result, reasoning on the last turn
FULL = [
    m(S, "You are terse."),
    m(U, "Hi there 👋"),
    m(A, "  Hello! Café ☕ — naïve.\n", reasoning="User greets."),
    m(U, "Weather in Paris?"),
    m(A, "", tool_calls=[tool_call("get_weather", city="Paris")]),
    m(T, "sunny, 22°C", name="get_weather"),
    m(A, "It is sunny — 22°C.", reasoning="The tool says sunny."),
]
# strictly alternating user/assistant, no system (Gemma, Vicuna)
ALT = [
    m(U, "Hi there 👋"),
    m(A, "  Hello! Café ☕ — naïve.\n", reasoning="User greets."),
    m(U, "Weather in Paris?"),
    m(A, "It is sunny — 22°C."),
]

QWEN3_TOOL = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
              '</tool_call><|im_end|>')
QWEN36_TOOL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
               "</function>\n</tool_call><|im_end|>")

# template -> (conversation, expected trained spans in order). Written by hand from the
# templates' text; see the comments for the why of each.
CASES = {
    # earlier turn: think stripped, content not trimmed; tool-call turn after the last user
    # query but without reasoning: no think block; last turn: think block kept, and
    # `<think>\n` is output because the generation prompt is only `<|im_start|>assistant\n`
    "qwen3": (FULL, ["  Hello! Café ☕ — naïve.\n<|im_end|>", QWEN3_TOOL,
                     "<think>\nThe tool says sunny.\n</think>\n\nIt is sunny — 22°C.<|im_end|>"]),
    "qwen3_2025-04_llamacpp": (FULL, ["  Hello! Café ☕ — naïve.\n<|im_end|>", QWEN3_TOOL,
                                      "<think>\nThe tool says sunny.\n</think>\n\n"
                                      "It is sunny — 22°C.<|im_end|>"]),
    # Qwen3.6 trims content; the generation prompt ends in `<think>\n`, which is prompt, so
    # the tool-call turn (after the last query: empty think block) starts at `\n</think>`
    "qwen3_6": (FULL, ["Hello! Café ☕ — naïve.<|im_end|>", "\n</think>\n\n" + QWEN36_TOOL,
                       "The tool says sunny.\n</think>\n\nIt is sunny — 22°C.<|im_end|>"]),
    "qwen3_5": (FULL, ["Hello! Café ☕ — naïve.<|im_end|>", "\n</think>\n\n" + QWEN36_TOOL,
                       "The tool says sunny.\n</think>\n\nIt is sunny — 22°C.<|im_end|>"]),
    # no reasoning support at all
    "qwen2_5": (FULL, ["  Hello! Café ☕ — naïve.\n<|im_end|>", QWEN3_TOOL,
                       "It is sunny — 22°C.<|im_end|>"]),
    # vLLM ChatML: no tool support (the tool-call turn renders empty: not trained) and no
    # `<|im_end|>` after the last message
    "chatml": (FULL, ["  Hello! Café ☕ — naïve.\n<|im_end|>", "It is sunny — 22°C."]),
    # Llama-3.1 trims content; one tool call as JSON
    "llama3_1": (FULL, ["Hello! Café ☕ — naïve.<|eot_id|>",
                        '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
                        "It is sunny — 22°C.<|eot_id|>"]),
    # Phi-3.5 drops tool calls (empty turn, not trained) and appends `\n` + EOS after the last
    # turn, which is not output
    "phi3_5": (FULL, ["  Hello! Café ☕ — naïve.\n<|end|>", "It is sunny — 22°C.<|end|>"]),
    # gpt-oss: earlier turns keep only the final channel and end `<|end|>`; the tool call is
    # a commentary message ending `<|call|>`; the last turn keeps its analysis and ends
    # `<|return|>`; `<|start|>assistant` is the generation prompt
    "gpt_oss": (FULL, ["<|channel|>final<|message|>  Hello! Café ☕ — naïve.\n<|end|>",
                       ' to=functions.get_weather<|channel|>commentary json<|message|>'
                       '{"city": "Paris"}<|call|>',
                       "<|channel|>analysis<|message|>The tool says sunny.<|end|>"
                       "<|start|>assistant<|channel|>final<|message|>It is sunny — 22°C.<|return|>"]),
    # Gemma trims; `<end_of_turn>` ends the turn, the `\n` after it is glue
    "gemma2": (ALT, ["Hello! Café ☕ — naïve.<end_of_turn>", "It is sunny — 22°C.<end_of_turn>"]),
}

REAL_QWEN = {"qwen3", "qwen3_2025-04_llamacpp", "qwen3_6", "qwen3_5", "qwen2_5", "chatml",
             "qwen3_6_training_generation_tags"}


def tokenizer_for(name: str, qwen_tok, real: bool):
    return qwen_tok if real else small_tokenizer(TEMPLATE_FAMILY[name])


def template_text(templates_dir: Path, name: str) -> str:
    text = (templates_dir / f"{name}.jinja").read_text()
    if name == "vicuna":
        # SOURCES.md: the file is written to be whitespace-stripped before use (its README
        # does exactly this); draftyard never rewrites a template, the operator does.
        text = text.replace("    ", "").replace("\n", "")
    return text


def random_conversation(seed: int) -> list[dict]:
    """System prompts, multi-turn, reasoning, tool calls, unicode, whitespace and empty
    contents, in random combinations (seeded)."""
    import random

    rng = random.Random(seed)
    words = ["alpha", "beta", "Café", "naïve", "東京", "🙂", "x=1;", "\n", "  ", "—", "𝔸", "ok."]

    def text(lo=1, hi=12):
        return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))

    # prompt texts carry a tag no answer contains, so the test can find them in the render
    conv = [m(S, "[sys] " + text())] if rng.random() < 0.4 else []
    for k in range(rng.randint(1, 3)):
        conv.append(m(U, f"[user {k}] " + text()))
        if rng.random() < 0.3:
            conv.append(m(A, rng.choice(["", text()]),
                          tool_calls=[tool_call("lookup", q=text(1, 3))]))
            conv.append(m(T, f"[tool {k}] " + text(), name="lookup"))
        a = m(A, rng.choice(["", text(), " " + text() + "\n", "\n\n" + text()]))
        if rng.random() < 0.5:
            a["reasoning"] = text()
        if not a["content"].strip() and not a.get("reasoning"):
            a["content"] = text()
        conv.append(a)
    return conv


def check_case(tok, text, conv, expected, train_on="all", **kw):
    mk = build_masker(tok, text, kw.pop("kwargs", None), train_on, NOW, **kw)
    out = tokenize_batch(mk, [rec(conv)])[0]
    assert not isinstance(out, RecordRejected), out
    loc = mk.locate(rec(conv))
    ids, mask = expected_mask(tok, loc.text, expected)
    assert out.input_ids.tolist() == ids
    got_turns = [tok.decode(out.input_ids[a:b], skip_special_tokens=False)
                 for a, b in runs(out.loss_mask.tolist())]
    assert got_turns == expected
    assert out.loss_mask.tolist() == mask          # token for token
    return mk, loc, out


@pytest.mark.parametrize(("name", "real"), [(n, r) for n in sorted(CASES) for r in (True, False)
                                             if n in REAL_QWEN or not r],
                         ids=lambda v: {True: "qwen3-tokenizer", False: "small-tokenizer"}.get(v, v))
def test_masks_match_hand_written_spans(name, real, templates_dir, qwen_tok):
    conv, expected = CASES[name]
    check_case(tokenizer_for(name, qwen_tok, real), template_text(templates_dir, name), conv,
               expected)


def test_vicuna_stripped_and_raw(templates_dir):
    tok = small_tokenizer("vicuna")
    stripped = template_text(templates_dir, "vicuna")
    _, loc, _ = check_case(tok, stripped, ALT, [" Hello! Café ☕ — naïve.</s>",
                                                " It is sunny — 22°C.</s>"])
    assert loc.text == ("<s>USER: Hi there 👋\nASSISTANT: Hello! Café ☕ — naïve.</s>\n"
                        "USER: Weather in Paris?\nASSISTANT: It is sunny — 22°C.</s>\n")
    # Raw, the file leaks its layout into the rendering; the masks stay right on what it
    # renders (the generation prompt `ASSISTANT:` is prompt, the leading space is output).
    raw = (templates_dir / "vicuna.jinja").read_text()
    _, loc, _ = check_case(tok, raw, ALT, [" Hello! Café ☕ — naïve.</s>",
                                           " It is sunny — 22°C.</s>"])
    assert "\n\n" in loc.text and loc.text != ("<s>USER: Hi there 👋\nASSISTANT: ...")


def test_train_on_last(templates_dir, qwen_tok):
    conv, expected = CASES["qwen3_6"]
    check_case(qwen_tok, template_text(templates_dir, "qwen3_6"), conv, expected[-1:], "last")
    conv, expected = CASES["gpt_oss"]
    check_case(small_tokenizer("harmony"), template_text(templates_dir, "gpt_oss"), conv,
               expected[-1:], "last")


def test_enable_thinking_false_moves_the_empty_think_block_into_the_prompt(templates_dir,
                                                                          qwen_tok):
    conv = [m(U, "Hi"), m(A, "Hello."), m(U, "Bye?"), m(A, "Bye!")]
    # thinking on (default): the last turn's empty think block is output
    check_case(qwen_tok, template_text(templates_dir, "qwen3"), conv,
               ["Hello.<|im_end|>", "<think>\n\n</think>\n\nBye!<|im_end|>"])
    # thinking off: the generation prompt carries `<think>\n\n</think>\n\n`
    mk, _, _ = check_case(qwen_tok, template_text(templates_dir, "qwen3"), conv,
                          ["Hello.<|im_end|>", "Bye!<|im_end|>"],
                          kwargs={"enable_thinking": False})
    assert mk.header == "<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_reasoning_only_turn_and_empty_placeholder(templates_dir, qwen_tok):
    # an empty assistant placeholder in the middle is context, not trained; a last turn with
    # reasoning and empty content trains its think block and end token
    conv = [m(U, "a"), m(A, ""), m(U, "b"), m(A, "", reasoning="thinking only")]
    check_case(qwen_tok, template_text(templates_dir, "qwen3"), conv,
               ["<think>\nthinking only\n</think>\n\n<|im_end|>"])


def test_a_token_crossing_the_turn_boundary_is_split(templates_dir, qwen_tok):
    # Qwen's pre-tokenizer merges `\n\n\n` (the header's `\n` + a reply starting `\n\n`)
    # into one token that crosses the boundary; it is split into the header's `\n` and the
    # reply's `\n\n`, as the target saw them at inference (prompt alone, then the reply)
    text = template_text(templates_dir, "qwen3")
    conv = [m(U, "a"), m(A, "\n\nearly"), m(U, "b"), m(A, "late")]
    mk, loc, out = check_case(qwen_tok, text, conv, ["\n\nearly<|im_end|>",
                                                     "<think>\n\n</think>\n\nlate<|im_end|>"])
    assert out.boundary_splits == 1
    whole = qwen_tok(loc.text, add_special_tokens=False)["input_ids"]
    assert len(out.input_ids) == len(whole) + 1
    a = runs(out.loss_mask.tolist())[0][0]
    assert qwen_tok.convert_ids_to_tokens(out.input_ids[a - 3:a + 1].tolist()) == \
        ["<|im_start|>", "assistant", "Ċ", "ĊĊ"]


def test_qwen36_empty_think_block_boundary(templates_dir, qwen_tok):
    # the generation prompt ends `<think>\n`; a turn without reasoning renders `<think>\n\n
    # </think>`: the `\n\n` token is split, the model's own `\n` is trained
    conv = [m(U, "q"), m(A, "a")]
    _, _, out = check_case(qwen_tok, template_text(templates_dir, "qwen3_6"), conv,
                           ["\n</think>\n\na<|im_end|>"])
    assert out.boundary_splits == 1


def test_four_byte_character_at_the_end_of_a_turn(templates_dir, qwen_tok):
    # ChatML leaves the last turn without `<|im_end|>`: the span ends on 𝔸, which the
    # byte-level vocabulary spells with several tokens; all of them are trained
    check_case(qwen_tok, template_text(templates_dir, "chatml"), [m(U, "q"), m(A, "x 𝔸")],
               ["x 𝔸"])


def test_combining_characters_survive_nfc(templates_dir, qwen_tok):
    # Qwen's normalizer is NFC: "e" + U+0301 is encoded as "é"; the self-check compares the
    # masked tokens with the normalized rendering, so the record is kept and exact
    conv = [m(U, "q"), m(A, "Cafe\u0301 ok")]
    mk = build_masker(qwen_tok, template_text(templates_dir, "qwen2_5"), None, "all", NOW)
    out = mk.encode([mk.locate(rec(conv))])[0]
    assert not isinstance(out, RecordRejected)
    assert qwen_tok.decode(out.input_ids[out.loss_mask.astype(bool)]) == "Café ok<|im_end|>"


def test_generation_tags_agree_with_anchors(templates_dir, qwen_tok):
    """The `{% generation %}` positive control: its blocks equal the anchor spans extended by
    exactly what the TRL author chose to include besides the model's output, the
    `<think>\\n` that ends this template's own generation prompt and the `\\n` glue after
    `<|im_end|>`. Nothing else differs."""
    text = template_text(templates_dir, "qwen3_6_training_generation_tags")
    gen = build_masker(qwen_tok, text, None, "all", NOW)
    anc = build_masker(qwen_tok, text, None, "all", NOW, mask_method="anchors")
    assert gen.method == "generation" and anc.method == "anchors"
    for conv in (FULL, ALT, [m(U, "x"), m(A, "y", reasoning="r")]):
        g, a = gen.locate(rec(conv)), anc.locate(rec(conv))
        assert g.text == a.text
        assert len(g.spans) == len(a.spans) == sum(x["role"] == "assistant" for x in conv)
        for (gs, ge), (as_, ae) in zip(g.spans, a.spans):
            assert g.text[gs:as_] == "<think>\n" and g.text[ae:ge] == "\n"
    # and the generation mask is the one transformers computes from the same blocks
    conv = FULL
    hf = qwen_tok.apply_chat_template(
        [{k: v for k, v in x.items() if k != "reasoning"} | (
            {"reasoning_content": x["reasoning"]} if "reasoning" in x else {}) for x in conv],
        chat_template=text, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    g = gen.encode([gen.locate(rec(conv))])[0]
    assert hf["input_ids"] == g.input_ids.tolist()
    assert hf["assistant_masks"] == g.loss_mask.tolist()


@pytest.mark.parametrize("name", sorted(TEMPLATE_FAMILY))
def test_mask_never_covers_prompt(name, templates_dir, qwen_tok):
    """Every template, every conversation shape it accepts: the mask is non-empty, each
    trained span starts right after the generation-prompt header (or a prefix of it), and no
    masked character lies in a system, user or tool message's text."""
    tok = tokenizer_for(name, qwen_tok, name in REAL_QWEN)
    mk = build_masker(tok, template_text(templates_dir, name), None, "all", NOW)
    kept = 0
    convs = [FULL, ALT, FULL[1:], [m(U, "Only one question?"), m(A, "One answer.")]]
    convs += [random_conversation(seed) for seed in range(25)]
    for conv in convs:
        r = rec(conv)
        out = tokenize_batch(mk, [r])[0]
        if isinstance(out, RecordRejected):
            # Gemma/Vicuna refuse system turns and tool roles; a template without tool or
            # reasoning support can leave nothing of a turn to train
            assert out.code in ("template_error", "empty_turns"), out
            continue
        kept += 1
        loc = mk.locate(r)
        assert out.loss_mask.sum() > 0
        assert len(loc.spans) == len(runs(out.loss_mask.tolist()))
        for s, _e in loc.spans:
            assert mk.header == "" or any(loc.text[:s].endswith(c)
                                          for c in mk.locator.header_candidates)
        for x in conv:
            if x["role"] == "assistant" or not x["content"].strip():
                continue
            pos = loc.text.find(x["content"].strip())
            while pos >= 0:
                end = pos + len(x["content"].strip())
                assert not any(s < end and pos < e for s, e in loc.spans), (name, x)
                pos = loc.text.find(x["content"].strip(), end)
    assert kept >= 8   # Gemma accepts only the alternating, system-free shapes


def test_rejections_carry_reasons(templates_dir, qwen_tok):
    q36 = build_masker(qwen_tok, template_text(templates_dir, "qwen3_6"), None, "all", NOW)
    recs = [
        rec([m(U, "prompt only")], "p"),                                    # needs generate
        rec([m(U, "q"), m(A, "   ")], "w"),                                 # blank answer
        rec([m(S, "sys"), m(A, "orphan answer")], "nq"),                    # no user query
        rec([m(U, "q"), m(S, "late"), m(A, "x")], "ls"),                    # late system
        rec([m(U, "q"), m(A, "fine")], "ok"),
    ]
    out = tokenize_batch(q36, recs)
    assert [(o.code, o.detail) if isinstance(o, RecordRejected) else "kept" for o in out] == [
        ("needs_generate", "no assistant answer in the record"),
        ("needs_generate", "no assistant answer in the record"),
        ("template_error", "No user query found in messages."),
        ("template_error", "System message must be at the beginning."),
        "kept",
    ]


def test_self_check_rejects_a_tokenizer_that_cannot_spell_the_answer(templates_dir):
    """A tokenizer that maps unseen characters to [UNK]: the masked tokens cannot decode to
    the rendered answer, so the record is rejected, not trained on a wrong text."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, **{c: i + 1 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz \n<|>_")}}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    t.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=t, eos_token="<|im_end|>", unk_token="[UNK]")
    mk = build_masker(tok, template_text(templates_dir, "chatml"), None, "all", NOW)
    out = tokenize_batch(mk, [rec([m(U, "hi"), m(A, "Ünïcode"), m(U, "x")])])[0]
    assert isinstance(out, RecordRejected) and out.code == "self_check_failed", out
    assert "Ünïcode" in out.detail


def test_length_policy_and_min_valid_tokens(templates_dir, qwen_tok):
    mk = build_masker(qwen_tok, template_text(templates_dir, "qwen2_5"), None, "all", NOW)
    r = rec([m(U, "q"), m(A, "one two three four five six seven eight nine ten")])
    full = tokenize_batch(mk, [r])[0]
    n, masked = len(full.input_ids), int(full.loss_mask.sum())
    cut = tokenize_batch(mk, [r], seq_length=n - 3)[0]
    assert len(cut.input_ids) == n - 3 and cut.truncated
    assert cut.input_ids.tolist() == full.input_ids[:n - 3].tolist()
    assert cut.loss_mask.tolist() == full.loss_mask[:n - 3].tolist()
    assert int(cut.loss_mask.sum()) == masked - 2   # `<|im_end|>` and the word before it;
    assert full.loss_mask[-1] == 0                  # the last `\n` is glue
    drop = tokenize_batch(mk, [r], seq_length=n - 3, length_policy="drop")[0]
    assert isinstance(drop, RecordRejected) and drop.code == "too_long"
    few = tokenize_batch(mk, [r], min_valid_tokens=masked + 1)[0]
    assert isinstance(few, RecordRejected) and few.code == "too_few_valid_tokens"
    prompt_len = int(full.loss_mask.argmax())   # cut at the end of the prompt: nothing left
    none = tokenize_batch(mk, [r], seq_length=prompt_len)[0]
    assert isinstance(none, RecordRejected) and none.code == "too_few_valid_tokens"
    assert "after truncation" in none.detail
