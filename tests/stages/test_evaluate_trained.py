"""evaluate on the demo target with a trained DFlash drafter (the issue's "must show"):

- tau of the trained drafter is clearly higher than the same drafter untrained;
- every speculative output equals plain greedy output, for both;
- tau_sim and real tau agree within a stated tolerance on the same data.

The drafter is trained here with speculators' model class, loss and optimizer in a minimal
loop (tests/stages/evaluate_support.py) on the target's own greedy answers; the default test
is a short variant, the `slow` one uses docs/FIELD-NOTES.md's demo settings.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.stages.conftest import target_input
from tests.stages.evaluate_support import (
    MASK_TOKEN,
    code_prompts,
    greedy_rows,
    make_drafter,
    render_prompts,
    train_dflash,
)
from tests.stages.typed import run_stage
from tests.stages.records_support import write_dataset

# tau_sim is teacher-forced on the target's greedy answers to the very prompts that real
# decoding runs. At the anchors decoding visited, the contexts are identical, so the two
# agree step by step (up to float ties between batched and incremental forwards). Over all
# anchors the estimate differs from real tau by the anchor-selection bias (decoding restarts
# right after a miss, where drafting is harder): docs/FIELD-NOTES.md saw 4.4 vs 3.0.
SAME_ANCHOR_TAU_TOLERANCE = 0.1   # absolute, on the anchors decoding visited
TAU_SIM_TOLERANCE = 0.3           # relative, |tau_sim - tau| / tau over all anchors
CLEAR_GAP = 1.0                   # trained tau must exceed untrained tau by at least this


def _evaluate(tmp_path: Path, target: Path, n_train: int, n_eval: int, max_new: int,
              steps: int, packed_len: int = 1024,
              max_anchors: int = 128) -> tuple[dict, list[float]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target).eval()
    texts = code_prompts(n_train + n_eval)
    train_texts, eval_texts = texts[:n_train], texts[n_train:]
    rows = greedy_rows(model, render_prompts(tok, train_texts), max_new)
    drafter = make_drafter(target, "dflash", rows=rows, block_size=8, aux=(1, 4, 7),
                           mask_token_id=tok.convert_tokens_to_ids(MASK_TOKEN))
    losses = train_dflash(drafter, model, rows, steps, packed_len=packed_len,
                          max_anchors=max_anchors)
    drafter.save_pretrained(tmp_path / "drafter")

    write_dataset(tmp_path / "heldout", [
        {"id": f"h{i}", "source": f"test:{i}", "messages": [{"role": "user", "content": t}]}
        for i, t in enumerate(eval_texts)])
    spec = {
        "inputs": {"target": target_input(target),
                   "drafter": {"path": str(tmp_path / "drafter"), "meta": {}},
                   "data": {"path": str(tmp_path / "heldout"), "kind": "dataset", "meta": {}}},
        "params": {"num_prompts": n_eval, "max_new_tokens": max_new, "min_tau": 2.0,
                   "chat_template_kwargs": {"enable_thinking": False}},
        "out_dir": str(tmp_path / "out"), "work_dir": str(tmp_path / "work"),
    }
    summary = run_stage("evaluate", spec)
    report = json.loads((tmp_path / "out" / "report" / "report.json").read_text())
    assert summary["tau"] == report["tau"]
    return report, losses


def _check(report: dict, losses: list[float], n_eval: int) -> None:
    base = report["baseline"]
    # the drafter learned
    assert sum(losses[-10:]) / 10 < 0.6 * sum(losses[:10]) / 10
    # lossless, trained and untrained alike, on every prompt
    assert report["lossless"] == {"checked": n_eval, "equal": n_eval, "first_mismatch": None}
    assert base["lossless"]["equal"] == n_eval
    # clearly better than the same drafter untrained
    assert base["kind"] == "untrained"
    assert base["tau"] < 1.3
    assert report["tau"] >= base["tau"] + CLEAR_GAP, (report["tau"], base["tau"])
    assert report["tau_sim"] > base["tau_sim"] + CLEAR_GAP
    # simulated acceptance agrees with real greedy speculative decoding
    same = report["tau_sim_on_decode_anchors"]
    assert same["steps"] >= 0.7 * report["steps"]
    assert same["equal_steps"] >= 0.95 * same["steps"], same
    assert abs(same["tau_sim"] - same["tau"]) <= SAME_ANCHOR_TAU_TOLERANCE, same
    rel = abs(report["tau_sim"] - report["tau"]) / report["tau"]
    assert rel <= TAU_SIM_TOLERANCE, (report["tau_sim"], report["tau_sim_joint"], report["tau"])
    rates = report["acceptance_rate_per_position"]
    assert rates == sorted(rates, reverse=True)  # P(first k accepted) cannot grow with k
    assert report["verdict"] == "accept"


def test_trained_drafter_beats_untrained_short(demo_target, tmp_path):
    """~35 s on a quiet 2-core box: 48 training answers, 240 steps of half-size packed
    batches, 8 held-out prompts (measured tau 2.62 vs 1.00; with 120 steps and 4 prompts it
    was 1.90, too close to the bar for a noisy box)."""
    report, losses = _evaluate(tmp_path, demo_target, n_train=48, n_eval=8, max_new=40,
                               steps=240, packed_len=512, max_anchors=64)
    _check(report, losses, 8)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_trained_drafter_beats_untrained_field_notes_settings(demo_target, tmp_path):
    """docs/FIELD-NOTES.md demo: 256 train / 32 held-out prompts, 96 new tokens, ~440 steps."""
    report, losses = _evaluate(tmp_path, demo_target, n_train=256, n_eval=32, max_new=96,
                               steps=440)
    _check(report, losses, 32)
    print(json.dumps({k: report[k] for k in ("tau", "tau_sim", "tau_sim_joint")}
                     | {"tau_baseline": report["baseline"]["tau"]}))
