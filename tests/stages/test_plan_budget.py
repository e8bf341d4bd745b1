"""plan: the records it finds unrenderable, against the failure budget of the stage that would
meet them first (with force_plan such a run otherwise stops in generate)."""

from __future__ import annotations

from tests.stages.conftest import target_input
from workers.stages.common import StageContext
from workers.stages.plan import run
from tests.stages.records_support import write_dataset


def _records(n: int, broken: set[int]) -> list[dict]:
    out = []
    for i in range(n):
        msgs = ([{"role": "system", "content": f"be brief {i}"}] if i in broken else
                [{"role": "user", "content": f"count to {i}"}])
        out.append({"id": f"r{i}", "source": f"plan-test:{i + 1}",
                    "messages": msgs + [{"role": "assistant", "content": "1 2 3"}]})
    return out


def _plan(tmp_path, tiny_target, templates_dir, records, stages) -> dict:
    write_dataset(tmp_path / "ds", records)
    tmpl = (templates_dir / "qwen3_6.jinja").read_text()
    # A whole run body (the plan stage checks it as POST /v1/runs would: contracts/run.py).
    run_body = {"name": "plan-budget", "target_id": "tgt_test", "dataset_id": "ds_test",
                "drafter": {"type": "dflash"}, "chat_template_kwargs": {"enable_thinking": False},
                "mode": "online",
                "stages": {"prepare": {"seq_length": 256}, "extract": None, "train": {},
                           **stages}}
    spec = {"inputs": {"dataset": {"path": str(tmp_path / "ds"), "meta": {}},
                       "target": target_input(tiny_target, chat_template=tmpl)},
            "params": {"run": run_body, "sample": 50}, "out_dir": str(tmp_path / "out"),
            "work_dir": str(tmp_path / "work")}
    return run(spec, StageContext.from_spec(spec))


def test_plan_warns_when_unrenderable_records_exceed_generates_budget(tiny_target,
                                                                       templates_dir, tmp_path):
    # 3 of 20 (15%) raise "No user query found in messages.": over generate's 10% budget.
    plan = _plan(tmp_path / "a", tiny_target, templates_dir, _records(20, {0, 7, 13}),
                 {"generate": {"backend": "hf"}})
    assert [(f["id"], f["line"]) for f in plan["failures"]] == [("r0", 1), ("r7", 8),
                                                                 ("r13", 14)]
    assert all("No user query found in messages." in f["reason"] for f in plan["failures"])
    warn = [w for w in plan["warnings"] if "cannot be rendered" in w]
    assert warn == ["3 of 20 sampled records (15%) cannot be rendered, more than generate's "
                    "max_failure_share=0.1: the run would stop in generate (fix or drop these "
                    "records, or raise stages.generate.max_failure_share)"]

    # Within the budget (1 of 20 = 5%): the failing record is named, no budget warning.
    plan = _plan(tmp_path / "b", tiny_target, templates_dir, _records(20, {4}),
                 {"generate": {"backend": "hf"}})
    assert [f["id"] for f in plan["failures"]] == ["r4"]
    assert not [w for w in plan["warnings"] if "cannot be rendered" in w]

    # Without generate, prepare meets them first, with its own budget (0.5 by default).
    plan = _plan(tmp_path / "c", tiny_target, templates_dir, _records(4, {0, 1, 2}), {})
    assert any("more than prepare's max_reject_share=0.5" in w for w in plan["warnings"])


def test_prompt_only_records_are_told_to_add_a_generate_stage(tiny_target, templates_dir,
                                                              tmp_path):
    # Every record prompt-only, no generate stage: prepare would reject them all
    # (needs_generate); no budget makes them trainable, so the advice is the stage to add.
    prompts = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"count to {i}"}]}
               for i in range(6)]
    plan = _plan(tmp_path / "a", tiny_target, templates_dir, prompts, {})
    check = next(c for c in plan["checks"] if c["name"] == "records_render")
    assert not check["ok"] and "needs_generate x6" in check["message"], check
    assert "add stages.generate" in check["message"], check
    warn = [w for w in plan["warnings"] if "cannot be rendered" in w]
    assert len(warn) == 1 and "add stages.generate" in warn[0], plan["warnings"]
    assert "raise stages.prepare.max_reject_share" not in warn[0], warn
    # With the stage the same records plan clean.
    plan = _plan(tmp_path / "b", tiny_target, templates_dir, prompts,
                 {"generate": {"backend": "hf"}})
    assert next(c for c in plan["checks"] if c["name"] == "records_render")["ok"], plan
