"""A run that compares three drafters (two dflash variants and an eagle3) on one prepared
dataset through the real service, and its report ranking them (app/runs/compare.py)."""

from __future__ import annotations

import json

import pytest

from tests.service.test_cli import cli
from tests.tiny import counting_records, write_jsonl


@pytest.mark.slow
def test_three_drafters_one_prepare_ranked_report(api, worker, home, tmp_path):
    from tests.tiny import tiny_model

    d = tiny_model(home / "models" / "tiny-compare", arch="qwen3")
    t = api.post("/v1/targets", {"name": "tiny-compare", "path": str(d)}).json()
    f = write_jsonl(tmp_path / "chat.jsonl", counting_records(16))
    ds = cli(api, "dataset", str(f), "--name", "compare-chat")
    assert ds.returncode == 0, ds.stdout + ds.stderr
    ds_id = api.get("/v1/datasets").json()["data"]
    ds_id = next(x["id"] for x in ds_id if x["name"] == "compare-chat")
    body = {"name": "compare", "target_id": t["id"], "dataset_id": ds_id,
            "drafters": [{"type": "dflash", "name": "b4", "block_size": 4, "num_anchors": 16,
                          "draft_vocab_size": 256},
                         {"type": "dflash", "name": "b3", "block_size": 3, "num_anchors": 16,
                          "draft_vocab_size": 256},
                         {"type": "eagle3", "ttt_steps": 3, "draft_vocab_size": 256}],
            "chat_template_kwargs": {"enable_thinking": False},
            "stages": {"generate": None, "prepare": {"seq_length": 256},
                       "extract": {"dtype": "float32", "backend": "hf"},
                       "train": {"epochs": 4, "max_steps": 8, "seq_length": 256},
                       "evaluate": {"num_prompts": 2, "max_new_tokens": 8}}}
    r = api.post("/v1/runs", body)
    assert r.status_code == 201, r.text
    run = r.json()
    keys = [j["run_stage"] for j in run["jobs"]]
    assert keys.count("prepare") == 1 and keys.count("extract:b4") == 1
    assert "extract:b3" not in keys and "extract:eagle3" in keys
    from tests.conftest import wait_for
    wait_for(lambda: api.get(f"/v1/runs/{run['id']}").json()["status"] in
             ("succeeded", "failed"), timeout=900)
    rep = api.get(f"/v1/runs/{run['id']}/report").json()
    assert rep["run"]["status"] == "succeeded", rep["stages"]
    rows = rep["drafters"]
    assert [r["rank"] for r in rows] == [1, 2, 3]
    assert {r["name"] for r in rows} == {"b4", "b3", "eagle3"}
    taus = [r["tau"] for r in rows]
    assert taus == sorted(taus, reverse=True)
    for r in rows:
        assert r["acceptance_per_position"] and r["train_seconds"] > 0
        assert r["drafter_bytes"] > 0 and r["drafter_parameters"] > 0 and r["verdict"]
    assert rep["evaluation"]["tau"] == rows[0]["tau"]
    p = cli(api, "runs", "show", run["id"])
    assert p.returncode == 0 and "drafters ranked by tau" in p.stdout, p.stdout + p.stderr
    (home / "compare-report.txt").write_text(p.stdout)
    print(p.stdout)
    print(json.dumps(rows, indent=1)[:3000])
