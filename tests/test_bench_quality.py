"""bench/quality.py's own logic, fast: its flags, the prompt sets it builds from a real
prompt file's shape, the seeds' spread, the data-size curve and its extrapolation, the table
and the JSON lines. The bench's pipeline itself runs through the API on the real target
(`make bench-quality`, docs/quality.md); here only what decides its numbers and verdicts."""

from __future__ import annotations

import json
import math

import pytest

from bench import quality as q
from contracts.drafters import DRAFTERS, drafter_types
from app.plans.params import name_params
from contracts.run import RunSpec
from tests.stages.test_run_drafters import TARGET, _jobs
from tests.stages.typed import run_stage
from workers.stages.common import StageContext


def _cell(n, seed, method, eval_set, tau, base=1.0, pl=1.1, pos=(0.1, 0.02, 0.0),
          verdict="reject"):
    return {"n": n, "seed": seed, "method": method, "eval_set": eval_set, "tau": tau,
            "tau_baseline": base, "tau_prompt_lookup": pl, "per_position": list(pos),
            "verdict": verdict, "verdict_reason": "prompt lookup ..."}


def test_flags_default_and_refuse_bad_values_by_name():
    a = q.parse_args([])
    assert a.sizes == [20, 40, 80] and a.seeds == 3 and a.drafters == ["dflash", "eagle3"]
    assert q.parse_args(["--sizes", "80,20,40,20"]).sizes == [20, 40, 80]
    assert a.humaneval_seeds == 3  # every seed on HumanEval too, unless told fewer
    assert q.parse_args(["--humaneval-seeds", "1"]).humaneval_seeds == 1
    for argv, flag in ((["--sizes", "20,x"], "--sizes"), (["--sizes", "0"], "--sizes"),
                       (["--drafters", "medusa"], "--drafters"),
                       (["--drafters", "dflash,medusa"], "--drafters"), (["--seeds", "0"], "--seeds"),
                       (["--answer-tokens", "0"], "--answer-tokens"),
                       (["--humaneval-seeds", "0"], "--humaneval-seeds"),
                       (["--draft-vocab", "8"], "--draft-vocab")):
        with pytest.raises(SystemExit) as e:
            q.parse_args(argv)
        assert str(e.value).startswith(flag), (argv, e.value)


def test_prompt_sets_are_nested_and_never_hold_the_evaluation_prompts(tmp_path):
    f = tmp_path / "sharegpt_prompts.jsonl"
    recs = [{"id": f"p{i}", "messages": [{"role": "user",
                                         "content": ("long " * 100 if i % 3 == 0 else
                                                     f"short\u2028question {i}")}]}
            for i in range(60)]
    f.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs),
                 encoding="utf-8")
    lines = q.short_prompts(f, 100)
    assert len(lines) == 40  # the U+2028 inside a prompt does not split a record
    ids = [json.loads(x)["id"] for x in lines]
    assert "p0" not in ids and ids[0] == "p1"
    sets = q.prompt_sets(lines, 4, [8, 16, 32])
    held = set(sets["heldout"])
    assert len(held) == 4 and not held & set(sets["train-32"])
    assert sets["train-8"] == sets["train-16"][:8] == sets["train-32"][:8]
    assert q.content_name("train-8", sets["train-8"]) == q.content_name("x", sets["train-8"]
                                                                       ).replace("x", "train-8")
    assert q.content_name("t", sets["train-8"]) != q.content_name("t", sets["train-16"])
    with pytest.raises(SystemExit, match="--sizes/--eval-prompts: 41 short prompts needed"):
        q.prompt_sets(lines, 9, [32])


def test_curve_per_doubling_and_the_prompts_it_would_take():
    fit = q.curve([(20, 1.0), (40, 1.1), (80, 1.2)], 2.5)
    assert fit is not None
    assert fit["per_doubling"] == pytest.approx(0.1)
    assert fit["prompts_for_goal"] == pytest.approx(20 * 2 ** 15)
    flat = q.curve([(20, 1.1), (40, 1.1)], 2.5)
    assert flat is not None and flat["prompts_for_goal"] is None
    assert q.curve([(20, 1.1)], 2.5) is None


def test_table_shows_the_seeds_spread_and_prompt_lookup():
    cells = [_cell(20, s, "dflash", "sharegpt", t) for s, t in enumerate((1.0, 1.1, 1.2))]
    cells.append(_cell(20, 0, "dflash", "humaneval", 1.3, pl=2.4))
    text = q.size_table(20, "dflash", cells, {"generate": [30.0], "train": [5.0, 6.0, 7.0]},
                        {"generate": 2})
    row = next(x for x in text.splitlines() if x.startswith("sharegpt"))
    assert "1.100+-0.100 (3 seeds)" in row and "1.100" in row.split("seeds)")[1]
    he = next(x for x in text.splitlines() if x.startswith("humaneval"))
    assert "2.400" in he and "0.10 0.02 0.00" in he
    assert "generate 30+2 reused" in text and "train 5/6/7" in text


def test_json_lines_judge_the_largest_size_against_both_targets():
    cells = [_cell(20, s, m, "sharegpt", 1.05) for s in range(3) for m in ("dflash", "eagle3")]
    cells += [_cell(80, 0, "dflash", "sharegpt", 3.0, pl=1.8),
              _cell(80, 0, "eagle3", "sharegpt", 2.6, pl=1.8),
              _cell(80, 0, "dflash", "humaneval", 1.0, pl=2.5)]
    out = {r["metric"]: r for r in q.json_lines(cells, [20, 80], ["dflash", "eagle3"])}
    for r in out.values():
        assert set(r) >= {"bench", "metric", "value", "baseline", "ratio", "target", "pass"}
    assert out["dflash_tau_sharegpt_80"]["pass"] is True  # 3.0 >= 2.5; humaneval not judged
    assert out["dflash_tau_vs_prompt_lookup_sharegpt_80"]["ratio"] == pytest.approx(3.0 / 1.8, abs=1e-4)
    assert out["dflash_tau_vs_prompt_lookup_sharegpt_80"]["pass"] is True
    assert out["eagle3_tau_sharegpt_80"]["pass"] is True
    assert out["eagle3_tau_vs_prompt_lookup_sharegpt_80"]["pass"] is False  # 1.44x < 1.5x
    per = out["dflash_tau_per_doubling_sharegpt"]
    assert per["value"] == pytest.approx((3.0 - 1.05) / 2) and per["pass"] is True
    assert per["prompts_for_tau_2_5"] <= 80
    missing = q.json_lines(cells[:6], [20, 160], ["dflash"])
    assert missing[0]["value"] is None and missing[0]["pass"] is False
    assert math.isclose(q.spread([1.0, 1.2])[1] or 0, 0.1414, abs_tol=1e-3)


def test_every_registered_drafter_can_be_asked_for_with_its_speculative_tokens():
    assert q.METHODS == drafter_types() and set(q.METHODS) >= {"peagle", "dspark", "mtp"}
    a = q.parse_args(["--drafters", ",".join(q.METHODS) + ",dflash", "--spec-tokens", "5"])
    assert a.drafters == list(drafter_types())  # each once, in the order asked
    entries = q.drafter_entries(a)
    assert [e["type"] for e in entries] == a.drafters
    # The same option the bench always set for the two it knew by name.
    assert entries[0]["block_size"] == 6 and entries[1]["ttt_steps"] == 5
    for e in entries:  # each drafts exactly --spec-tokens: its own option, read off the registry
        opts = DRAFTERS[e["type"]].options
        own = {k: v for k, v in e.items() if k in opts.model_fields}
        assert len(own) == 1 and opts(**own).speculative_tokens() == 5, e
    # ... and the service takes the bench's run body naming all of them.
    by = {j.key: j for j in _jobs(q.run_body(a, "tgt_x", "ds_x", "ds_h", 20, 0))}
    for e in entries:
        assert by[f"train:{e['type']}"].params["drafter"] == {
            k: v for k, v in e.items() if k != "name"}


def _weighted(tmp_path, **config):
    folder = tmp_path / "target"
    folder.mkdir(exist_ok=True)
    (folder / "model.safetensors").write_bytes(b"")  # the plan only asks that weights exist
    return {**TARGET, "path": str(folder), "config": {**TARGET["config"], **config}}


def _plan(run: dict, target: dict, tmp_path) -> dict:
    """The plan stage itself (what POST /v1/plans answers), on a config-only target."""
    ctx = StageContext(events_path=None, out_dir=tmp_path / "out", work_dir=tmp_path / "w")
    out = run_stage("plan", {"params": {"run": run, "free_bytes_override": 1 << 40},
                             "inputs": {"target": target, "dataset": None}}, ctx)
    return name_params(out, RunSpec.model_validate(run))


def test_the_plan_says_which_drafters_the_target_cannot_have(tmp_path):
    a = q.parse_args(["--drafters", ",".join(q.METHODS)])
    body = q.run_body(a, "tgt_x", "ds_x", "ds_h", 20, 0)
    na = q.not_applicable(_plan(body, _weighted(tmp_path), tmp_path), a.drafters)
    assert list(na) == ["mtp"]  # no mtp_num_hidden_layers in the target's config
    assert "mtp_num_hidden_layers=None" in na["mtp"] and na["mtp"].endswith("(train:mtp)")
    mtp_target = _weighted(tmp_path, mtp_num_hidden_layers=1)
    assert q.not_applicable(_plan(body, mtp_target, tmp_path), a.drafters) == {}
    # Any other refusal stops the bench with the plan's words, not a silent drop.
    with pytest.raises(SystemExit, match="the plan refuses the run: target_weights: .*no weights"):
        q.not_applicable(_plan(body, TARGET, tmp_path), a.drafters)


def test_a_drafter_the_target_cannot_have_gets_a_row_with_the_reason(capsys):
    a = q.parse_args(["--sizes", "20", "--seeds", "1", "--drafters", "peagle,dspark,mtp"])
    cells = [_cell(20, 0, m, es, 1.1) for m in ("peagle", "dspark")
             for es in ("sharegpt", "humaneval")]
    rows = [{"n": 20, "seed": 0, "key": "generate", "wall_s": 100.0, "reused_from": None},
            {"n": 20, "seed": 0, "key": "train:peagle", "wall_s": 200.0, "reused_from": None}]
    why = "mtp fine-tunes the target's own ... mtp_num_hidden_layers=None ... (train:mtp)"
    out = q.report(cells, rows, a, {"mtp": why})
    text = capsys.readouterr().out
    assert f"== N=20 prompts, mtp: not applicable: {why}" in text
    assert "== N=20 prompts, peagle (1 seed(s))" in text and "train 200" in text
    assert "== N=20 prompts, dspark (1 seed(s))" in text
    assert "\nmtp " not in text.split("data-size curve")[1]  # no curve for it
    by = {r["metric"]: r for r in out}
    assert by["mtp_tau_sharegpt_20"]["not_applicable"] == why
    assert by["mtp_tau_sharegpt_20"]["pass"] is None and by["mtp_tau_sharegpt_20"]["value"] is None
    assert by["peagle_tau_sharegpt_20"]["value"] == pytest.approx(1.1)
