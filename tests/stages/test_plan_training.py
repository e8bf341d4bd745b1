"""The plan's training estimate: steps from records, tokens per step, epochs and
max_steps, and a warning when max_steps cannot be reached."""

from __future__ import annotations

from contracts.train import TrainParams
from tests.stages.test_plan_budget import _plan
from workers.stages.plan_training import _bins, estimate_training


def _records(n: int) -> list[dict]:
    return [{"id": f"r{i}", "source": f"t:{i + 1}", "messages": [
        {"role": "user", "content": f"count to {i}"},
        {"role": "assistant", "content": " ".join(str(k) for k in range(40))}]}
        for i in range(n)]


def test_steps_follow_records_epochs_and_max_steps_and_unreachable_max_steps_warns(
        tiny_target, templates_dir, tmp_path):
    # 40 records; 32 held out by default?: no, at most half (20), so 20 are trained on.
    plan = _plan(tmp_path / "a", tiny_target, templates_dir, _records(40),
                 {"train": {"seq_length": 512, "epochs": 1, "max_steps": 30}, "evaluate": {}})
    t = plan["estimates"]["training"]
    assert t["held_out"] == 20 and t["records"] == 20
    # each record is ~100 tokens: 5 fit a 512-token step, so 20 records are 4 steps an epoch
    assert 3 <= t["steps_per_epoch"] <= 5 and t["steps"] == t["steps_per_epoch"]
    warn = [w for w in plan["warnings"] if "max_steps 30 cannot be reached" in w]
    assert warn and f"give {t['steps']} step(s)" in warn[0] and "stages.train.epochs" in warn[0]
    # enough epochs: max_steps caps the run, no warning
    plan = _plan(tmp_path / "b", tiny_target, templates_dir, _records(40),
                 {"train": {"seq_length": 512, "epochs": 20, "max_steps": 30}, "evaluate": {}})
    t = plan["estimates"]["training"]
    assert t["steps"] == 30 and not [w for w in plan["warnings"] if "cannot be reached" in w]


def test_packing_and_scaling():
    assert _bins([100] * 10, 512) == 2 and _bins([600, 10], 512) == 2 and _bins([], 64) == 0
    train = TrainParams.model_validate(
        {"drafter": {"type": "dflash"}, "seq_length": 256, "epochs": 1, "max_steps": 30})
    warnings: list[str] = []
    est = estimate_training({"train": train}, [100, 100], 3 * 10, warnings)
    # 30 records (no split) of ~100 tokens, 2 a step: 15 steps an epoch, max_steps unreachable
    assert est["steps"] == 15 and est["held_out"] == 0 and len(warnings) == 1
    assert estimate_training({}, [100], 5, []) is None


def test_draft_vocab_coverage_is_reported_and_warns_when_low(tiny_target, templates_dir,
                                                             tmp_path):
    # Answers of Python's builtin names (hundreds of distinct tokens): a 16-token draft
    # vocabulary covers a small share, the default 2,048 all of it.
    import builtins

    names = sorted(n for n in dir(builtins) if not n.startswith("_"))
    records = [{"id": f"r{i}", "source": f"t:{i + 1}", "messages": [
        {"role": "user", "content": f"list {i}"},
        {"role": "assistant", "content": " ".join(names[i * 7:i * 7 + 20])}]}
        for i in range(20)]
    small = _plan(tmp_path / "a", tiny_target, templates_dir, records,
                  {"train": {"drafter": {"type": "dflash", "draft_vocab_size": 16}},
                   "evaluate": {}})
    cov = small["estimates"]["draft_vocab_coverage"]
    assert cov["draft_vocab_size"] == 16 and cov["training"] < 0.95
    assert cov["held_out"] is not None and cov["held_out"] <= 1.0
    assert [w for w in small["warnings"] if "draft vocabulary of 16 tokens covers only" in w]
    full = _plan(tmp_path / "b", tiny_target, templates_dir, records,
                 {"train": {}, "evaluate": {}})
    assert full["estimates"]["draft_vocab_coverage"]["training"] == 1.0
    assert not [w for w in full["warnings"] if "draft vocabulary" in w]
