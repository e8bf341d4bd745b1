"""A team's first day (issue 27) through the real service: a GPU job or run stage with no node
to run on says so at once; names where users think in names; errors that name the cause."""

from __future__ import annotations

import json

import pytest

from tests.conftest import wait_for


@pytest.fixture(scope="module")
def target(api, home):
    from workers.stages.tinymodel import build_tiny_target

    d = build_tiny_target(home / "models" / "tiny-first-day", arch="qwen3")
    r = api.post("/v1/targets", {"name": "first-day", "path": str(d)})
    assert r.status_code == 201, r.text
    return r.json()


@pytest.fixture(scope="module")
def dataset(api, home):
    p = home / "data" / "first-day.jsonl"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"count to {i}"},
        {"role": "assistant", "content": " ".join(str(k) for k in range(i % 7 + 5))}]}) + "\n"
        for i in range(40)))
    d = api.post("/v1/datasets", {"name": "first-day", "path": str(p)}).json()
    return wait_for(lambda: (x := api.get(f"/v1/datasets/{d['id']}").json())["status"]
                    != "ingesting" and x, 120, 0.3, "ingest")


def test_a_gpu_job_with_no_node_for_it_says_why_at_once(api, worker):
    """It used to wait with no reason until a scheduler pass wrote one."""
    r = api.post("/v1/jobs", {"type": "probe", "gpus": 64, "params": {"sleep_s": 0}})
    assert r.status_code == 201, r.text
    job = r.json()
    try:
        why = job["pending_reason"]
        assert why and ("64 GPU(s) on one node" in why or "no schedulable node" in why), job
        assert "draftyard worker --gpus" in why
        ev = api.get(f"/v1/jobs/{job['id']}/events").json()["data"]
        assert any(e["kind"] == "warning" and e["data"]["message"] == why for e in ev)
    finally:
        api.post(f"/v1/jobs/{job['id']}/cancel")
    # a CPU job gets no such reason
    r = api.post("/v1/jobs", {"type": "probe", "params": {"sleep_s": 0}})
    assert r.status_code == 201 and r.json()["pending_reason"] is None, r.text


def test_the_plan_warns_of_a_gpu_stage_without_a_gpu_node_and_estimates_steps(
        api, worker, target, dataset):
    body = {"name": "p", "target_id": target["id"], "dataset_id": dataset["id"],
            "drafter": {"type": "dflash", "num_layers": 1, "draft_vocab_size": 256},
            "mode": "online",
            "stages": {"prepare": {"seq_length": 256}, "extract": None,
                       "train": {"gpus": 64, "epochs": 1, "max_steps": 30,
                                 "seq_length": 256}}}
    plan = api.post("/v1/plans", body, timeout=120)
    assert plan.status_code == 200, plan.text
    plan = plan.json()
    assert any(w.startswith("stages.train.gpus 64: ") for w in plan["warnings"]), plan
    t = plan["estimates"]["training"]
    assert t["held_out"] == 20 and t["records"] == 20 and t["steps"] < 30
    assert any("max_steps 30 cannot be reached" in w for w in plan["warnings"])


def test_names_are_unique_per_owner_and_409_names_the_existing_one(api, target, dataset, home):
    r = api.post("/v1/targets", {"name": "first-day", "path": target["path"]})
    assert r.status_code == 409, r.text
    e = r.json()["error"]
    assert e["code"] == "name_taken" and e["param"] == "name" and target["id"] in e["message"]
    r = api.post("/v1/datasets", {"name": "first-day", "path": str(home / "data" /
                                                                  "first-day.jsonl")})
    assert r.status_code == 409 and dataset["id"] in r.json()["error"]["message"], r.text
    # another owner may use the same name
    member = api.as_(api.post("/v1/users", {"name": "fd-other"}).json()["token"])
    r = member.post("/v1/targets", {"name": "first-day", "path": target["path"]})
    assert r.status_code == 201, r.text


def test_a_run_and_a_plan_take_names_for_ids(api, worker, target, dataset):
    body = {"name": "by-name", "target_id": "first-day", "dataset_id": "first-day",
            "drafter": {"type": "dflash", "num_layers": 1, "draft_vocab_size": 256},
            "mode": "online", "stages": {"prepare": {"seq_length": 256}, "extract": None,
                                         "train": {"max_steps": 2, "seq_length": 256},
                                         "evaluate": None}}
    plan = api.post("/v1/plans", body, timeout=120)
    assert plan.status_code == 200 and plan.json()["ok"], plan.text
    r = api.post("/v1/runs", body, timeout=120)
    assert r.status_code == 201, r.text
    run = r.json()
    api.post(f"/v1/runs/{run['id']}/cancel")
    # the stored spec and the jobs carry the ids, not the names
    assert run["spec"]["target_id"] == target["id"]
    assert run["spec"]["dataset_id"] == dataset["id"]
    prep = next(j for j in run["jobs"] if j["run_stage"] == "prepare")
    assert prep["inputs"] == {"dataset": dataset["id"], "target": target["id"]}
    r = api.post("/v1/plans", {**body, "target_id": "no-such-target"})
    assert r.status_code == 422 and r.json()["error"]["param"] == "target_id", r.text
    assert "no target has the id or name 'no-such-target'" in r.json()["error"]["message"]
