"""Held-out evaluation by default: the README's Python snippet, with no evaluation
set, measures its drafter on records it never trained on and says so; the same drafter
measured on the records it trained on (in-sample) gets another tau."""

from __future__ import annotations

import json
import random

import pytest

from tests.tiny import tiny_model

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima".split()


@pytest.mark.slow
def test_readme_snippet_without_an_evaluation_set_is_measured_on_held_out_records(
        api, worker, home, tmp_path, monkeypatch):
    from draftyard import Client

    monkeypatch.setenv("DRAFTYARD_URL", api.url)
    monkeypatch.setenv("DRAFTYARD_TOKEN", api.token)
    rnd = random.Random(5)
    f = tmp_path / "orca.jsonl"  # answers no rule predicts: only memory helps in-sample
    f.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"say the words of card {i}"},
        {"role": "assistant", "content": " ".join(rnd.choice(WORDS) for _ in range(12))}]})
        + "\n" for i in range(80)))
    models = tiny_model(home / "models" / "tiny-heldout", arch="qwen3")

    # The README's snippet, as written (a tiny target, a small drafter and few steps so that
    # it fits a test; no evaluation set given).
    c = Client(timeout=180)
    tgt = c.create_target("tiny-heldout", str(models))
    ds = c.upload_dataset(f, name="orca")
    ds = c.wait_dataset(ds["id"], 120)
    body = {"name": "orca-dflash", "target_id": tgt["id"], "dataset_id": ds["id"],
            "drafter": {"type": "dflash", "num_layers": 1, "block_size": 4,
                        "draft_vocab_size": 256},
            "chat_template_kwargs": {"enable_thinking": False},
            "stages": {"prepare": {"seq_length": 256},
                       "extract": {"dtype": "float32", "backend": "hf"},
                       "train": {"epochs": 40, "max_steps": 60, "seq_length": 256,
                                 "drafter": {"num_anchors": 16}},
                       "evaluate": {"num_prompts": 16, "max_new_tokens": 12}}}
    assert c.plan(body)["ok"]
    run = c.wait_run(c.create_run(body)["id"], timeout=900)
    assert run["status"] == "succeeded", json.dumps(run["stages"], default=str)[:2000]
    split = next(j for j in run["jobs"] if j["run_stage"] == "split")
    assert split["metrics_summary"]["held_out"] == 32  # 2% of 80, raised to the 32 floor
    report = c.run_report(run["id"])
    ev = report["evaluation"]
    assert ev["evaluated_on"] == "held out: 32 records never trained on", ev
    assert "measured held out: 32 records never trained on" in ev["verdict_reason"]

    # The same drafter on the records it trained on: another number, and said so.
    by = {j["run_stage"]: j for j in run["jobs"]}
    job = c.submit_job("evaluate", inputs={
        "target": tgt["id"], "drafter": {"job": by["train"]["id"]},
        "data": {"job": by["prepare"]["id"]}},
        params={**body["stages"]["evaluate"], "evaluated_on": "in_sample",
                "chat_template_kwargs": {"enable_thinking": False}})
    job = c.wait_job(job["id"], timeout=600)
    assert job["status"] == "succeeded", job.get("error")
    ins = job["metrics_summary"]
    assert ins["evaluated_on"].startswith("in-sample, as requested")
    print(f"tau held out {ev['tau']:.3f} (sim {ev['tau_sim']:.3f}); "
          f"in-sample {ins['tau']:.3f} (sim {ins['tau_sim']:.3f})")
    assert (ev["tau"], ev["tau_sim"]) != (ins["tau"], ins["tau_sim"])
