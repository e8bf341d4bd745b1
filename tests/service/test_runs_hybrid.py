"""The seeds' target family through the whole service.

A tiny random `Qwen3_5ForCausalLM` (layer_types linear x3 + full, as Qwen3.6-27B per four
layers), the real Qwen3 tokenizer and the Qwen3.6 template from the fixtures; whitespace-only
tokens have zero embedding rows so the random target answers with text (docs/FIELD-NOTES.md). The
whole chain runs from `POST /v1/runs` (generate hf -> prepare -> extract hf -> train dflash
-> evaluate with the untrained baseline) on 20 prompt-only and multi-turn records plus two
the template cannot render, and the trained drafter must beat the untrained one on prompts
of its training distribution. A third unrenderable record breaks generate's budget: the
job's error then names the records, their reasons and the template's messages.
"""

from __future__ import annotations

import json
from pathlib import Path
import time

import pytest

from tests.conftest import wait_for
from tests.service.test_runs import _dataset
from tests.stages.conftest import shared_fixtures
from tests.stages.test_evaluate_trained import CLEAR_GAP, TAU_SIM_TOLERANCE

NO_USER = "No user query found in messages."
LATE_SYSTEM = "System message must be at the beginning."


@pytest.fixture(scope="module")
def hybrid(api, home):
    from workers.stages.tinymodel import build_tiny_target

    tmpl = (shared_fixtures() / "chat_templates" / "qwen3_6.jinja").read_text()
    d = build_tiny_target(home / "models" / "tiny-hybrid", arch="qwen3_5", layers=4,
                          chat_template=tmpl, zero_whitespace=True)
    r = api.post("/v1/targets", {"name": "tiny-hybrid", "path": str(d)})
    assert r.status_code == 201, r.text
    t = r.json()
    assert t["architecture"] == "Qwen3_5ForCausalLM" and t["num_layers"] == 4, t
    return t


TOPICS = ["a list", "a file", "a dict", "a string", "a socket", "a thread", "a queue",
          "a date", "a path", "a number"]


def _records(good: int, broken: int) -> list[dict]:
    """`good` records (prompt-only and multi-turn) + `broken` the Qwen3.6 template refuses."""
    out = []
    for i in range(good):
        ask = {"role": "user", "content": f"Write a Python helper {i} that handles "
                                          f"{TOPICS[i % len(TOPICS)]}."}
        if i % 2:
            out.append({"id": f"r{i}", "messages": [
                ask, {"role": "assistant", "content": "def helper(): pass"},
                {"role": "user", "content": "Now add a docstring."}]})
        else:
            out.append({"id": f"r{i}", "messages": [ask]})
    bad = [{"id": "bad-no-user", "messages": [{"role": "system", "content": "be brief"},
                                              {"role": "assistant", "content": "ok"}]},
           {"id": "bad-no-user-2", "messages": [{"role": "system", "content": "be terse"},
                                                {"role": "assistant", "content": "fine"}]},
           {"id": "bad-late-system", "messages": [
               {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
               {"role": "system", "content": "late"}, {"role": "user", "content": "and?"}]}]
    # Spread through the file (lines 4, 12, 20) so the lines in the error are checked.
    for k, rec in enumerate(bad[:broken]):
        out.insert(3 + 8 * k, rec)
    return out


def _body(target, ds, *, steps: int, max_tokens: int, prompts: int) -> dict:
    return {
        "name": "hybrid", "target_id": target["id"], "dataset_id": ds["id"],
        # The plan rightly flags the unrenderable records; the run goes ahead anyway.
        "force_plan": True,
        "drafter": {"type": "dflash", "num_layers": 1, "block_size": 8,
                    "draft_vocab_size": 1024},
        "chat_template_kwargs": {"enable_thinking": False},
        "stages": {
            "generate": {"backend": "hf", "max_tokens": max_tokens, "batch_size": 32},
            "prepare": {"seq_length": 256},
            "extract": {"dtype": "float32", "backend": "hf"},
            "train": {"max_steps": steps, "epochs": steps, "seq_length": 256,
                      "checkpoint_every": steps, "log_every": 10,
                      "drafter": {"num_anchors": 64}},
            # Prompts of the training distribution: the records generate answered, rendered
            # as generate rendered them. (The default, the tokenized rows, takes each row's
            # unmasked prefix as the prompt. Measured here while prepare re-tokenized the
            # text: from 7 of 20 row prefixes the target's greedy answer differed from the
            # row's trained answer. Prepare now builds generated turns' rows from generate's
            # own prompt and completion ids (prepare/tokenrows.py), so the prefixes are the
            # contexts the answers were generated in: tests/stages/test_prepare_token_rows.py.)
            "evaluate": {"data": "@generate", "num_prompts": prompts,
                         "max_new_tokens": max_tokens, "baseline": "untrained"},
        },
    }


def _whole_run(api, home, hybrid, name: str, **size) -> tuple[dict, float]:
    ds = _dataset(api, home, name, _records(good=20, broken=2))
    assert ds["status"] == "ready" and ds["num_records"] == 22, ds
    t = time.time()
    r = api.post("/v1/runs", {**_body(hybrid, ds, **size), "name": name}, timeout=180)
    assert r.status_code == 201, r.text
    run = r.json()
    assert [j["run_stage"] for j in run["jobs"]] == ["generate", "prepare", "extract", "train",
                                                     "evaluate"]
    final = wait_for(lambda: (x := api.get(f"/v1/runs/{run['id']}").json())["status"]
                     in ("succeeded", "failed", "cancelled") and x, 900, 0.5, "the run")
    took = time.time() - t
    assert final["status"] == "succeeded", json.dumps(final["stages"], default=str)[:3000]
    return final, took


def _check_trained_beats_untrained(api, final: dict) -> dict:
    gen = next(j for j in final["jobs"] if j["run_stage"] == "generate")
    # Two records the template cannot render: within the budget, named with their messages.
    s = gen["metrics_summary"]
    assert s["num_records"] == 20 and s["failed_by_reason"] == {"template_error": 2}, s
    assert [(f["id"], f["line"]) for f in s["failed_sample"]] == [("bad-no-user", 4),
                                                                  ("bad-no-user-2", 12)]
    assert all(NO_USER in f["message"] for f in s["failed_sample"])
    rep = final["report"]
    tau, base, sim = rep["tau"], rep["tau_baseline"], rep["tau_sim"]
    assert tau >= base + CLEAR_GAP, rep
    assert abs(sim - tau) / tau <= TAU_SIM_TOLERANCE, rep
    assert rep["verdict"] == "accept", rep["verdict_reason"]
    assert "meets min_tau 1.5" in rep["verdict_reason"]
    assert "beats the untrained baseline's tau" in rep["verdict_reason"]
    full = api.get(f"/v1/artifacts/{rep['artifact_id']}/files/report.json")
    assert full.status_code == 200, full.text
    diag = full.json()["diagnostics"]
    assert diag["draft_vocab"]["draft_vocab_size"] == 1024
    assert diag["acceptance_rate_per_position"] == rep["acceptance_rate_per_position"]
    return rep


def _trained_beats_untrained(api, home, hybrid, name: str, **size) -> None:
    final, took = _whole_run(api, home, hybrid, name, **size)
    rep = _check_trained_beats_untrained(api, final)
    print(f"\n{name}: tau {rep['tau']:.3f} vs untrained {rep['tau_baseline']:.3f}, tau_sim "
          f"{rep['tau_sim']:.3f}, oov share {rep['oov_share']}, run {took:.0f} s")


@pytest.mark.slow  # a whole hybrid run (~80 s); tests/service/test_runs.py runs a whole run in make test
def test_hybrid_whole_run_trained_beats_untrained(api, worker, home, hybrid):
    _trained_beats_untrained(api, home, hybrid, "hybrid-short", steps=60, max_tokens=32,
                             prompts=8)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_hybrid_whole_run_larger(api, worker, home, hybrid):
    """More training steps, longer answers, more held-out prompts."""
    _trained_beats_untrained(api, home, hybrid, "hybrid-long", steps=240, max_tokens=96,
                             prompts=20)


def test_generate_over_budget_names_records_reasons_and_messages(api, worker, home, hybrid):
    """3 of 22 records unrenderable > max_failure_share 0.1 (the issue's case): the plan
    warns; generate, forced through, fails naming the failed ids, lines, reasons and
    messages, in the job's error and in what `draftyard submit --follow` prints."""
    from tests.service.test_cli import cli

    ds = _dataset(api, home, "hybrid-broken", _records(good=19, broken=3))
    body = {**_body(hybrid, ds, steps=2, max_tokens=8, prompts=1), "name": "over-budget"}
    plan = api.post("/v1/plans", body, timeout=180).json()
    assert any("3 of 22 sampled records (14%) cannot be rendered, more than generate's "
               "max_failure_share=0.1" in w for w in plan["warnings"]), plan["warnings"]
    params = {**body["stages"]["generate"], "chat_template_kwargs": {"enable_thinking": False}}
    r = cli(api, "submit", "generate", "--follow", "--params", json.dumps(params),
            "--inputs", json.dumps({"dataset": ds["id"], "target": hybrid["id"]}))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "too_many_failures: 3 of 22 records failed" in r.stdout, r.stdout
    line = next(x for x in r.stdout.splitlines() if "record bad-late-system line 20" in x)
    assert "template_error: " in line and LATE_SYSTEM in line, r.stdout
    assert "full list: " in r.stdout
    job_id = r.stdout.split("submitted ")[1].split()[0]
    j = api.job(job_id)
    assert j["status"] == "failed" and j["error"]["code"] == "too_many_failures", j["error"]
    err = j["error"]
    assert "bad-no-user (template_error)" in err["message"]
    d = err["details"]
    assert d["failed_by_reason"] == {"template_error": 3}
    got = {f["id"]: f for f in d["failed_sample"]}
    for rid, line, message in (("bad-no-user", 4, NO_USER), ("bad-no-user-2", 12, NO_USER),
                               ("bad-late-system", 20, LATE_SYSTEM)):
        assert (got[rid]["line"], got[rid]["reason"]) == (line, "template_error"), got
        assert message in got[rid]["message"], got
    # The full list is in the job's folder, kept although the job failed.
    listed = [json.loads(x) for x in Path(d["failures_file"]).read_text(encoding="utf-8").splitlines()]
    assert sorted(f["id"] for f in listed) == ["bad-late-system", "bad-no-user", "bad-no-user-2"]
    assert d["failures_file"].startswith(str(home / "jobs" / job_id))
