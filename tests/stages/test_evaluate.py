"""evaluate: lossless speculative decoding, the fit check, the stage's report and verdict.

Runs on the random tiny targets (qwen3 and the qwen3.5 hybrid) with untrained drafters; the
trained-drafter comparison lives in test_evaluate_trained.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from tests.stages.conftest import target_input
from tests.stages.evaluate_support import MASK_TOKEN, make_drafter, write_tokenized
from workers.stages.common import StageContext, StageError
from tests.stages.typed import run_stage
from workers.stages.evaluate.drafter import load_drafter, read_drafter
from workers.stages.evaluate.proposers import make_proposer
from workers.stages.evaluate.specdec import (
    acceptance_stats,
    hf_greedy,
    plain_greedy,
    speculative_greedy,
)
from workers.stages.evaluate.target import TargetRunner, eos_ids, load_target
from workers.stages.evaluate.tau_sim import tau_from_position_acc
from tests.stages.records_support import write_dataset


@pytest.fixture(scope="module")
def tok(tiny_target):
    """The tiny target's tokenizer, loaded once for the module (a load parses the 11 MB
    tokenizer.json: about half a CPU-second); the tests only read it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_target)


@pytest.fixture(scope="module")
def dflash_dir(tiny_target, tok, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dflash_untrained")
    make_drafter(tiny_target, "dflash",
                 mask_token_id=tok.convert_tokens_to_ids(MASK_TOKEN)).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def eagle_dir(tiny_target, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("eagle3_untrained")
    make_drafter(tiny_target, "eagle3", ttt_steps=3).save_pretrained(out)
    return out


def _prompts(tok, texts):
    return [tok(tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                        add_generation_prompt=True, enable_thinking=False),
                add_special_tokens=False)["input_ids"] for t in texts]


def _spec(tmp_path: Path, target_dir: Path, drafter_dir: Path, data: dict, params: dict,
          **target_overrides) -> dict:
    return {
        "inputs": {"target": target_input(target_dir, **target_overrides),
                   "drafter": {"path": str(drafter_dir), "meta": {}}, "data": data},
        "params": params,
        "out_dir": str(tmp_path / "out"), "work_dir": str(tmp_path / "work"),
        "events_path": str(tmp_path / "events.jsonl"),
    }


def _events(tmp_path: Path) -> list[dict]:
    p = tmp_path / "events.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def _dataset(folder: Path, n: int = 4) -> dict:
    recs = [{"id": f"r{i}", "source": f"test:{i}", "messages": [
        {"role": "system", "content": "You write Python."},
        {"role": "user", "content": f"Write a helper number {i} that reads a file."},
        {"role": "assistant", "content": "def read(path):\n    return open(path).read()"}]}
        for i in range(n)]
    write_dataset(folder, recs)
    return {"path": str(folder), "kind": "dataset",
            "meta": {"chat_template_kwargs": {"enable_thinking": False}}}


# -- the maths of the numbers -------------------------------------------------------------

def test_tau_formula_and_acceptance_stats():
    assert tau_from_position_acc([1.0, 1.0, 1.0]) == 4.0
    assert tau_from_position_acc([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert tau_from_position_acc([0.8, 0.5], joint=True) == pytest.approx(2.3)
    s = acceptance_stats([0, 2, 7, 3], num_spec=7)
    assert s["tau"] == pytest.approx(1 + 12 / 4)
    assert s["acceptance_rate_per_position"][:4] == [0.75, 0.75, 0.5, 0.25]
    assert s["tau"] == pytest.approx(1 + sum(s["acceptance_rate_per_position"]))
    assert s["histogram"] == {"1": 1, "2": 0, "3": 1, "4": 1, "5": 0, "6": 0, "7": 0, "8": 1}


# -- lossless -------------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["dflash", "eagle3"])
def test_lossless_untrained_drafter_equals_greedy(which, tiny_target, tok, dflash_dir,
                                                  eagle_dir):
    d = read_drafter(dflash_dir if which == "dflash" else eagle_dir)
    model = load_target(tiny_target)
    eos = eos_ids(model, tok)
    proposer = make_proposer(load_drafter(d, tiny_target))
    runner = TargetRunner(model, d.aux_layer_ids)
    for q in _prompts(tok, ["Sort a list of dicts by key.", "def parse(path):"]):
        ref = hf_greedy(model, q, 24, eos)
        spec = speculative_greedy(runner, proposer, q, 24, eos)
        assert spec.tokens == ref
        assert plain_greedy(runner, q, 24, eos).tokens == ref
        assert len(ref) == 24
        # every step committed accepted + 1 tokens (the bonus), and nothing beyond the budget
        assert sum(a + 1 for a in spec.accepted) >= 23
        assert all(0 <= a <= proposer.num_spec for a in spec.accepted)


def test_lossless_on_hybrid_target_rolls_back_linear_attention(tiny_target_q35, tmp_path):
    """Qwen3.5 hybrid: rejected drafts must be rolled back from the gated-delta-net state."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_target_q35)
    make_drafter(tiny_target_q35, "dflash", aux=(1, 4, 8),
                 mask_token_id=tok.convert_tokens_to_ids(MASK_TOKEN)).save_pretrained(
        tmp_path / "d")
    d = read_drafter(tmp_path / "d")
    model = load_target(tiny_target_q35)
    eos = eos_ids(model, tok)
    proposer = make_proposer(load_drafter(d, tiny_target_q35))
    runner = TargetRunner(model, d.aux_layer_ids)
    q = tok("<|im_start|>user\nwrite a parser<|im_end|>\n<|im_start|>assistant\n",
            add_special_tokens=False)["input_ids"]
    ref = hf_greedy(model, q, 20, eos)
    spec = speculative_greedy(runner, proposer, q, 20, eos)
    assert spec.tokens == ref
    assert spec.accepted and len(spec.accepted) >= 10  # many rollbacks happened


@pytest.mark.parametrize("which", ["dflash", "eagle3"])
def test_incremental_proposals_match_the_training_forward(which, tiny_target, dflash_dir,
                                                          eagle_dir):
    """The decoding-time proposer (incremental, no mask) and the teacher-forced path
    (DFlash: anchored blocks under a mask; EAGLE-3: speculators' own TTT forward) predict the
    same tokens when teacher forcing feeds the proposer's own drafts back."""
    d = read_drafter(dflash_dir if which == "dflash" else eagle_dir)
    model = load_target(tiny_target)
    proposer = make_proposer(load_drafter(d, tiny_target))
    runner = TargetRunner(model, d.aux_layer_ids)
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 5000, (30,), generator=gen).tolist()
    for p in (9, 17, 29):
        proposer.reset()
        proposer.extend(runner.full_forward(prefix[:p]).aux)
        drafts = proposer.propose(prefix[:p + 1])
        assert len(drafts) == proposer.num_spec
        row = prefix[:p + 1] + drafts + [0]  # teacher tokens after the anchor = the drafts
        step = runner.full_forward(row)
        forced = proposer.teacher_forced(step.aux, torch.tensor(row), torch.tensor([p]))
        assert forced[0].tolist() == drafts


def test_dflash_teacher_forced_matches_speculators_training_forward(tiny_target, dflash_dir):
    """Our anchored-block DFlash forward reproduces speculators' own training forward
    (`_backbone_forward` with every valid position as an anchor) token for token."""
    d = read_drafter(dflash_dir)
    model = load_target(tiny_target)
    drafter = load_drafter(d, tiny_target)
    proposer = make_proposer(drafter)
    runner = TargetRunner(model, d.aux_layer_ids)
    ids = torch.randint(0, 5000, (40,), generator=torch.Generator().manual_seed(1))
    step = runner.full_forward(ids.tolist())
    bs = proposer.num_spec + 1
    with torch.no_grad():
        _, logits, _, _, idx = drafter._backbone_forward(
            step.aux, ids[None], torch.ones(1, 40, dtype=torch.long), step.last_hidden,
            torch.zeros(1, 40, dtype=torch.long), max_anchors=64)
    n = 40 - bs  # valid anchors: all but the last block; the other 64 - n slots are padding
    anchors = idx.view(-1, bs)[:n, 0]
    assert anchors.tolist() == list(range(n))  # every valid position, in order
    theirs = logits.argmax(-1).view(-1, bs)[:n, 1:]
    theirs = theirs + drafter.d2t[theirs]
    ours = proposer.teacher_forced(step.aux, ids, anchors)
    assert torch.equal(ours, theirs)


def test_pre_norm_last_layer_is_the_norm_input(tiny_target):
    """Aux id N is the input of the final norm (speculators' convention), not HF's last entry."""
    model = load_target(tiny_target)
    runner = TargetRunner(model, [1, 8])
    step = runner.full_forward(list(range(100, 120)))
    with torch.no_grad():
        hs = model(torch.tensor([list(range(100, 120))]), output_hidden_states=True).hidden_states
    h1, h8 = step.aux[..., :64], step.aux[..., 64:]
    assert torch.allclose(h1, hs[1])
    assert not torch.allclose(h8, hs[8])
    assert torch.allclose(model.get_decoder().norm(h8), hs[8], atol=1e-5)



@pytest.mark.parametrize("which", ["tiny_target", "tiny_target_q35"])
def test_verify_runs_the_head_lazily_and_agrees_with_a_full_forward(which, request):
    """`verify` computes the head at slot 0 with the forward and the other slots only when
    asked; its greedy tokens and aux equal a full forward's on the same cache."""
    target = request.getfixturevalue(which)
    model = load_target(target)
    n = model.config.get_text_config().num_hidden_layers
    runner = TargetRunner(model, [1, n])
    prompt, block = list(range(300, 340)), [7, 11, 400, 401, 402, 9000, 5, 6]
    runner.new_cache()
    runner.forward(prompt, last_logits_only=True)
    full = runner.forward(block)
    runner.new_cache()
    runner.forward(prompt, last_logits_only=True)
    v = runner.verify(block)
    assert len(v._greedy) == 1  # slot 0 only, until more is asked
    assert v.greedy(0) == int(full.logits[0, 0].argmax())
    assert [v.greedy(i) for i in range(len(block))] == full.logits[0].argmax(-1).tolist()
    assert torch.allclose(v.aux, full.aux, atol=1e-5)
    runner.new_cache()
    runner.forward(prompt, last_logits_only=True)
    every = runner.verify(block, every_slot=True)  # the head on every slot in the forward
    assert every._greedy == full.logits[0].argmax(-1).tolist()
    runner.new_cache()
    runner.forward(prompt, last_logits_only=True)
    v = runner.verify(block)
    # Its cache rolls back like a forward's: keep anchor + 1 accepted draft, then go on.
    runner.rollback(len(block) - 2)
    nxt = runner.forward([v.greedy(1)])
    runner.new_cache()
    runner.forward(prompt, last_logits_only=True)
    runner.forward(block)
    runner.rollback(len(block) - 2)
    ref = runner.forward([v.greedy(1)])
    assert torch.allclose(nxt.logits, ref.logits, atol=1e-5)

# -- the fit check: refused before any compute ------------------------------------------------

def _other_target(folder: Path, **cfg) -> Path:
    """A tiny Qwen3 target of another shape (no tokenizer needed to build a drafter for it)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    base = {"vocab_size": 151669, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "tie_word_embeddings": True}
    base.update(cfg)
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(**base)).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("shape,aux,expect", [
    ({"hidden_size": 32, "head_dim": 8}, (1, 4, 7), "hidden size: drafter 32, target 64"),
    ({"vocab_size": 32000}, (1, 4, 7), "vocab size: drafter built for 32000, target 151669"),
    ({"num_hidden_layers": 16}, (2, 9, 14),
     "layer ids: drafter aux layer ids [9, 14] out of range"),
])
def test_drafter_for_another_target_is_refused_before_compute(shape, aux, expect, tiny_target,
                                                               tmp_path):
    other = _other_target(tmp_path / "other", **shape)
    drafter = make_drafter(other, "dflash", aux=aux, draft_vocab=1024, mask_token_id=0)
    drafter.save_pretrained(tmp_path / "drafter")
    data = _dataset(tmp_path / "ds")
    spec = _spec(tmp_path, tiny_target, tmp_path / "drafter", data, {"num_prompts": 2})
    t0 = time.monotonic()
    with pytest.raises(StageError) as e:
        run_stage("evaluate", spec)
    assert e.value.code == "drafter_target_mismatch"
    assert expect in e.value.message
    assert time.monotonic() - t0 < 5.0  # JSON only: no model was loaded
    assert not (tmp_path / "out" / "report").exists()
    assert not [ev for ev in _events(tmp_path) if ev["kind"] == "progress"]


def test_invalid_params_name_the_field(tiny_target, dflash_dir, tmp_path):
    spec = _spec(tmp_path, tiny_target, dflash_dir, _dataset(tmp_path / "ds"),
                 {"num_prompts": 0, "bogus": 1})
    with pytest.raises(StageError) as e:
        run_stage("evaluate", spec)
    assert e.value.code == "invalid_params"
    assert "num_prompts" in e.value.message and "bogus" in e.value.message


def test_thinking_mode_mismatch_is_refused_unless_allowed(tiny_target, dflash_dir, tmp_path):
    data = _dataset(tmp_path / "ds")
    data["meta"] = {"chat_template_kwargs": {"enable_thinking": True}}
    params = {"num_prompts": 1, "max_new_tokens": 10, "measures": ["tau_sim"], "baseline": None,
              "chat_template_kwargs": {"enable_thinking": False}}
    spec = _spec(tmp_path, tiny_target, dflash_dir, data, params)
    with pytest.raises(StageError) as e:
        run_stage("evaluate", spec)
    assert e.value.code == "template_mismatch"
    assert '"enable_thinking": true' in e.value.message
    assert '"enable_thinking": false' in e.value.message

    spec["params"]["allow_template_mismatch"] = True
    out = run_stage("evaluate", spec)
    report = json.loads((tmp_path / "out" / "report" / "report.json").read_text())
    assert out["tau_sim"] is not None
    assert "enable_thinking" in report["template_mismatch"]
    assert any(ev["kind"] == "warning" for ev in _events(tmp_path))


# -- the stage end to end --------------------------------------------------------------------

def test_stage_writes_report_plot_and_rejects_below_min_tau(tiny_target, dflash_dir, tmp_path):
    data = _dataset(tmp_path / "ds", n=3)
    params = {"num_prompts": 3, "max_new_tokens": 12, "min_tau": 1.5,
              "chat_template_kwargs": {"enable_thinking": False}}
    spec = _spec(tmp_path, tiny_target, dflash_dir, data, params)
    ctx = StageContext.from_spec(spec)
    summary = run_stage("evaluate", spec, ctx)
    ctx.close()
    folder = tmp_path / "out" / "report"
    report = json.loads((folder / "report.json").read_text())
    assert (folder / "acceptance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # An untrained drafter on this target is never accepted: tau is exactly 1 (bonus only).
    assert report["tau"] == pytest.approx(1.0)
    assert report["lossless"]["checked"] == 3 and report["lossless"]["equal"] == 3
    assert report["baseline"]["kind"] == "untrained"
    assert report["baseline"]["lossless"]["equal"] == 3
    assert len(report["acceptance_rate_per_position"]) == 7
    assert sum(report["histogram"].values()) == report["steps"]
    assert report["tau_sim"] is not None and report["tau_sim_source"].startswith("prompts")
    assert set(report["tokens_per_s"]) == {"specdec", "target_alone", "speedup"}
    assert report["chat_template_kwargs"] == {"enable_thinking": False}
    assert len(report["chat_template_sha256"]) == 64
    assert report["verdict"] == "reject" and "below min_tau 1.5" in report["verdict_reason"]
    diag = report["diagnostics"]
    assert diag["acceptance_rate_per_position"] == report["acceptance_rate_per_position"]
    # Prompt lookup, decoded by the same loop with the drafter's K: lossless too, its own
    # tau and acceptance per position, and the verdict compares the drafter with it.
    pl = report["prompt_lookup"]
    assert pl["num_speculative_tokens"] == 7
    assert (pl["prompt_lookup_min"], pl["prompt_lookup_max"]) == (2, 5)
    assert pl["lossless"]["checked"] == 3 and pl["lossless"]["equal"] == 3
    assert len(pl["acceptance_rate_per_position"]) == 7
    assert pl["tau"] == pytest.approx(1 + sum(pl["acceptance_rate_per_position"]))
    assert sum(pl["histogram"].values()) == pl["steps"] > 0
    assert diag["prompt_lookup_acceptance_rate_per_position"] == \
        pl["acceptance_rate_per_position"]
    assert f"prompt lookup's tau {pl['tau']:.3f}" in report["verdict_reason"]
    assert summary == {"tau": report["tau"], "tau_sim": report["tau_sim"],
                       "tau_baseline": report["baseline"]["tau"],
                       "tau_sim_baseline": report["baseline"]["tau_sim"],
                       "tau_prompt_lookup": pl["tau"], "verdict": "reject",
                       "verdict_reason": report["verdict_reason"],
                       "oov_share": diag["draft_vocab"]["oov_share"],
                       "acceptance_rate_per_position": report["acceptance_rate_per_position"],
                       "evaluated_on": None}  # a lone evaluate job: no run said what it holds
    art = [ev["data"] for ev in _events(tmp_path) if ev["kind"] == "artifact"]
    assert art and art[0]["kind"] == "eval_report" and art[0]["path"] == "report"


def test_tokenized_rows_with_eagle3_and_given_baseline(tiny_target, tok, eagle_dir, dflash_dir,
                                                       tmp_path):
    """kind=tokenized: tau_sim on the rows, prompts from their untrained part; a baseline
    drafter of another type is measured side by side."""
    rows = [(q + [11, 22, 33, 44, 55, 66, 77, 88], [0] * len(q) + [1] * 8)
            for q in _prompts(tok, ["one", "two", "three"])]
    data = {"path": str(write_tokenized(tmp_path / "tok", rows)), "kind": "tokenized",
            "meta": {}}
    spec = _spec(tmp_path, tiny_target, eagle_dir, data,
                 {"num_prompts": 2, "max_new_tokens": 8})
    spec["inputs"]["baseline_drafter"] = {"path": str(dflash_dir), "meta": {}}
    run_stage("evaluate", spec)
    report = json.loads((tmp_path / "out" / "report" / "report.json").read_text())
    assert report["data"] == {"path": data["path"], "kind": "tokenized", "prompts": 2, "rows": 3}
    assert report["tau_sim_source"] == "tokenized rows"
    # 8 answer tokens, 3 drafts per step: anchors at answer tokens 0..5 -> 6 blocks per row
    assert report["blocks"] == 18
    assert report["drafter"]["kind"] == "eagle3"
    assert report["drafter"]["num_speculative_tokens"] == 3
    assert report["baseline"]["kind"] == "drafter"
    assert report["baseline"]["lossless"]["equal"] == 2
    assert len(report["baseline"]["acceptance_rate_per_position"]) == 7


def test_no_better_than_untrained_is_rejected_by_default_naming_the_oov_share(
        tiny_target, tok, tmp_path):
    """Default params (min_tau 1.5, min_gain 0.2): a drafter whose draft vocabulary misses
    the target's answers is rejected, and the reason names the numbers and the cause."""
    from workers.stages.evaluate.data import prompts_from_dataset

    model = load_target(tiny_target)
    data = _dataset(tmp_path / "ds", n=3)
    # The prompts evaluate will use, and the target's answers to them (its references).
    prompts, _ = prompts_from_dataset(data["path"], tok, tok.chat_template,
                                      {"enable_thinking": False}, 3, 0)
    answers = [hf_greedy(model, q, 12, eos_ids(model, tok)) for q in prompts]
    answer_ids = {t for a in answers for t in a}
    # A draft vocabulary of 256 tokens the answers never use: nothing can be drafted.
    unused = [t for t in range(1000, 5000) if t not in answer_ids][:256]
    rows = [([t], [1]) for t in unused]
    out = tmp_path / "oov_drafter"
    make_drafter(tiny_target, "dflash", rows=rows, draft_vocab=256,
                 mask_token_id=tok.convert_tokens_to_ids(MASK_TOKEN)).save_pretrained(out)
    spec = _spec(tmp_path, tiny_target, out, data,
                 {"num_prompts": 3, "max_new_tokens": 12,
                  "chat_template_kwargs": {"enable_thinking": False}})
    summary = run_stage("evaluate", spec)
    report = json.loads((tmp_path / "out" / "report" / "report.json").read_text())
    assert report["params"]["min_tau"] == 1.5 and report["params"]["min_gain"] == 0.2
    cov = report["diagnostics"]["draft_vocab"]
    assert cov["draft_vocab_size"] == 256 and cov["oov_share"] == 1.0
    assert cov["reference_tokens"] == sum(len(a) for a in answers) > 0
    assert report["tau"] == pytest.approx(1.0)
    assert report["diagnostics"]["acceptance_rate_per_position"] == [0.0] * 7
    reason = report["verdict_reason"]
    assert summary["verdict"] == "reject" and summary["oov_share"] == 1.0
    assert "tau 1.000 (greedy speculative decoding) is below min_tau 1.5" in reason
    assert "untrained baseline's tau 1.000 by +0.000" in reason and "min_gain 0.2" in reason
    assert "100% of the" in reason and "256-token draft vocabulary" in reason
    assert "likely cause" in reason

