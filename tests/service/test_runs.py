"""Runs and plans through the real service: the whole chain on a tiny target, a plan that
names the records a template breaks, cancel during train and a retry that reuses finished
stages and resumes training. The plan and refusal tests run on both backends (tests/
conftest.py both_backends)."""

from __future__ import annotations

import time

import pytest

from tests.conftest import wait_for
from tests.stages.conftest import shared_fixtures
from tests.tiny import ingested, write_jsonl

pytestmark = pytest.mark.both_backends


@pytest.fixture(scope="module")
def target(api, home, tmp_path_factory):
    """A tiny random Qwen3 in the model roots, registered with the Qwen3.6 template (it
    raises "No user query found in messages." on a [system, assistant] record)."""
    from tests.tiny import tiny_model

    d = tiny_model(home / "models" / "tiny-run", arch="qwen3")
    tmpl = (shared_fixtures() / "chat_templates" / "qwen3_6.jinja").read_text()
    r = api.post("/v1/targets", {"name": "tiny", "path": str(d), "chat_template": tmpl})
    assert r.status_code == 201, r.text
    t = r.json()
    assert t["num_layers"] == 8 and t["hidden_size"] == 64 and t["has_chat_template"]
    return t


def _dataset(api, home, name: str, records: list[dict]) -> dict:
    return ingested(api, write_jsonl(home / "data" / f"{name}.jsonl", records), name, 120)


def _records(n: int, broken_every: int | None = None) -> list[dict]:
    out = []
    for i in range(n):
        if broken_every and i % broken_every == 0:
            # No user turn: the Qwen3.6 template raises on this shape.
            out.append({"messages": [{"role": "system", "content": f"be brief {i}"},
                                     {"role": "assistant", "content": f"ok {i} " * 5}]})
        else:
            out.append({"messages": [{"role": "user", "content": f"count to {i}"},
                                     {"role": "assistant", "content": " ".join(
                                         str(k) for k in range(i % 7 + 5))}]})
    return out


def _body(target, ds, **over) -> dict:
    body = {"name": "t", "target_id": target["id"], "dataset_id": ds["id"],
            "drafter": {"type": "dflash", "num_layers": 1, "block_size": 4,
                        "draft_vocab_size": 256},
            "chat_template_kwargs": {"enable_thinking": False},
            "stages": {"generate": None, "prepare": {"seq_length": 256},
                       "extract": {"dtype": "float32", "backend": "hf"},
                       "train": {"max_steps": 6, "seq_length": 256, "checkpoint_every": 2,
                                 "log_every": 1, "drafter": {"num_anchors": 16}},
                       "evaluate": None}}
    body.update(over)
    return body


def test_plan_names_broken_records_and_run_refuses_unless_forced(api, worker, target, home):
    ds = _dataset(api, home, "third-broken", _records(30, broken_every=3))
    body = _body(target, ds)
    t = time.time()
    r = api.post("/v1/plans", body, timeout=180)
    assert r.status_code == 200, r.text
    assert time.time() - t < 60  # 10 s on a quiet machine; CI shares its two cores
    plan = r.json()
    assert not plan["ok"]
    rr = next(c for c in plan["checks"] if c["name"] == "records_render")
    assert not rr["ok"] and rr["details"]["failed"] == 10
    assert {f["source"].split(":")[1] for f in plan["failures"]} == {str(i + 1) for i in range(0, 30, 3)}
    assert all("No user query found in messages." in f["reason"] for f in plan["failures"])
    assert plan["estimates"]["hidden_state_bytes"] > 0 and plan["estimates"]["tokens"] > 0
    r = api.post("/v1/runs", body, timeout=180)
    assert r.status_code == 422 and r.json()["error"]["code"] == "plan_failed"
    run = api.post("/v1/runs", {**body, "force_plan": True}, timeout=180)
    assert run.status_code == 201, run.text
    run = run.json()
    assert [j["run_stage"] for j in run["jobs"]] == ["prepare", "extract", "train"]
    # The forced run's prepare drops exactly the ten records the plan named (the stages after
    # it are the whole-run tests' business: cancelled here once prepare has answered).
    prep = api.wait_job(run["jobs"][0]["id"], timeout=300)
    api.post(f"/v1/runs/{run['id']}/cancel")
    assert prep["status"] == "succeeded", prep["error"]
    art = api.get(f"/v1/artifacts/{prep['outputs'][0]}").json()
    assert art["meta"]["num_rows"] == 20 and art["meta"]["num_rejected"] == 10


def test_plan_checks_layers_disk_and_thinking(api, worker, target, home):
    ds = _dataset(api, home, "plan-ok", _records(12))
    body = _body(target, ds)
    body["drafter"]["target_layer_ids"] = [1, 42]
    body["stages"]["evaluate"] = {"chat_template_kwargs": {"enable_thinking": True}}
    plan = api.post("/v1/plans", body, timeout=180).json()
    checks = {c["name"]: c for c in plan["checks"]}
    assert not checks["layer_ids"]["ok"] and "layers 0..7" in checks["layer_ids"]["message"]
    assert not checks["thinking_mode"]["ok"]
    assert checks["records_render"]["ok"]


@pytest.mark.postgres_only("reads PostgreSQL's pg_stat_activity")
def test_the_plan_of_a_run_holds_no_db_transaction(api, worker, target, home):
    """POST /v1/runs runs the plan (seconds, up to 120) before its transaction begins: no
    connection of the API sits idle in a transaction meanwhile (in embedded mode that
    transaction held SQLite's write lock for the whole plan)."""
    import threading

    from sqlalchemy import text

    from app.core.db import unit_of_work

    ds = _dataset(api, home, "plan-tx", _records(12))
    body = _body(target, ds)
    body["drafter"]["target_layer_ids"] = [1, 42]  # the plan fails: no job runs after it
    out: list = []
    t = threading.Thread(target=lambda: out.append(api.post("/v1/runs", body, timeout=180)))
    t.start()
    held = 0
    while t.is_alive():
        with unit_of_work(read_only=True) as s:
            held = max(held, s.scalar(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state = 'idle in transaction' "
                "AND now() - state_change > interval '500 milliseconds'")))
        time.sleep(0.1)
    t.join()
    assert out[0].status_code == 422 and out[0].json()["error"]["code"] == "plan_failed"
    assert held == 0


def test_run_with_bad_stage_params_is_422_naming_the_stage_field(api, worker, target, home):
    ds = _dataset(api, home, "bad-params", _records(4))
    runs_before = api.get("/v1/runs").json()["data"]
    body = _body(target, ds)
    body["stages"]["train"]["lr"] = -1
    r = api.post("/v1/runs", body)
    assert r.status_code == 422, r.text
    e = r.json()["error"]
    assert e["param"] == "stages.train.lr" and "greater than 0" in e["message"], e
    assert e["code"] != "plan_failed", e  # refused by validation, before the plan is run
    body = _body(target, ds)
    body["stages"]["prepare"]["train_on"] = "everything"
    e = api.post("/v1/runs", body).json()["error"]
    assert e["param"] == "stages.prepare.train_on", e
    assert api.get("/v1/runs").json()["data"] == runs_before  # nothing half-created


@pytest.fixture
def gpu_node(gpu_workers):
    """A worker of its own declaring one GPU, stopped and marked offline after the test. It
    starts its model stages' starter as it registers (DRAFTYARD_STAGE_WARM_UP): the imports
    overlap the stages before train instead of delaying train's start."""
    gpu_workers.start("runs-gpu", env={"DRAFTYARD_STAGE_WARM_UP": "1"})
    return "runs-gpu"


def _gpus_of(api, node: str) -> list:
    n = next(n for n in api.get("/v1/nodes").json()["data"] if n["name"] == node)
    return [g["job_id"] for g in n["gpus"]]


@pytest.mark.postgres_only("a second worker, declaring a GPU")
def test_cancel_run_during_train_then_retry_reuses_and_resumes(api, worker, target, home,
                                                               gpu_node):
    """Train holds a declared GPU. Cancel during train: train and the waiting evaluate end
    cancelled, the GPU is free again. Retry: split, prepare and extract are not run again,
    train resumes from its checkpoint, evaluate runs. (No generate stage: the demo, the
    generate-kill and hybrid-run tests run it inside whole runs; here it would only add a
    stage process.)"""
    ds = _dataset(api, home, "resume", _records(24))
    body = _body(target, ds, name="resume")
    body["stages"]["train"].update(max_steps=40, epochs=200, checkpoint_every=3, gpus=1)
    body["stages"]["evaluate"] = {"num_prompts": 2, "max_new_tokens": 8}
    run = api.post("/v1/runs", body, timeout=180)
    assert run.status_code == 201, run.text
    run = run.json()
    assert [j["run_stage"] for j in run["jobs"]] == ["split", "prepare", "extract", "train",
                                                     "evaluate"]
    train = next(j for j in run["jobs"] if j["run_stage"] == "train")
    wait_for(lambda: api.job(train["id"])["status"] == "running"
             and len(api.get(f"/v1/jobs/{train['id']}/metrics").json().get("loss", [])) >= 5,
             300, 0.5, "train to log a few steps")
    j = api.job(train["id"])
    assert j["gpus_assigned"] == [{"node": gpu_node, "index": 0}]
    assert _gpus_of(api, gpu_node) == [train["id"]]
    before = {j["run_stage"]: j for j in api.get(f"/v1/runs/{run['id']}").json()["jobs"]}
    r = api.post(f"/v1/runs/{run['id']}/cancel")
    assert r.status_code == 200
    final = wait_for(lambda: (x := api.get(f"/v1/runs/{run['id']}").json())["status"]
                     == "cancelled" and x, 60, 0.5, "run cancelled")
    st = {j["run_stage"]: j["status"] for j in final["jobs"]}
    assert st == {"split": "succeeded", "prepare": "succeeded", "extract": "succeeded",
                  "train": "cancelled", "evaluate": "cancelled"}
    assert _gpus_of(api, gpu_node) == [None]  # the declared GPU is free again
    steps_before = [s for s, _ in api.get(f"/v1/jobs/{train['id']}/metrics").json()["loss"]]
    r = api.post(f"/v1/runs/{run['id']}/retry")
    assert r.status_code == 200, r.text
    done = wait_for(lambda: (x := api.get(f"/v1/runs/{run['id']}").json())["status"]
                    in ("succeeded", "failed") and x, 400, 1, "run to finish after retry")
    assert done["status"] == "succeeded", done["stages"]
    after = {j["run_stage"]: j for j in done["jobs"]}
    for s in ("split", "prepare", "extract"):  # not run again
        assert after[s]["started_at"] == before[s]["started_at"]
        assert after[s]["outputs"] == before[s]["outputs"] and after[s]["attempt"] == 1
    assert after["train"]["attempt"] == 2 and after["evaluate"]["status"] == "succeeded"
    steps = [s for s, _ in api.get(f"/v1/jobs/{train['id']}/metrics").json()["loss"]]
    resumed = steps[len(steps_before):]
    assert resumed and min(resumed) > 1, (steps_before, resumed)  # continued, not from step 0
    assert done["report"] and "tau" in done["report"]
    assert _gpus_of(api, gpu_node) == [None]


# slow (74 s): reuse of every stage is also exercised by the cancel/retry run test above.
@pytest.mark.slow
@pytest.mark.postgres_only("long (slow), and the cancel/retry run covers reuse")
def test_same_run_again_reuses_every_stage_unless_forced(api, worker, target, home):
    ds = _dataset(api, home, "reuse", _records(12))
    body = _body(target, ds, name="reuse")
    first = api.post("/v1/runs", body, timeout=180).json()
    wait_for(lambda: api.get(f"/v1/runs/{first['id']}").json()["status"] == "succeeded",
             300, 1, "first run")
    again = api.post("/v1/runs", body, timeout=180).json()
    done = wait_for(lambda: (x := api.get(f"/v1/runs/{again['id']}").json())["status"]
                    in ("succeeded", "failed") and x, 60, 0.5, "second run")
    firsts = {j["run_stage"]: j for j in api.get(f"/v1/runs/{first['id']}").json()["jobs"]}
    for j in done["jobs"]:
        assert j["reused_from"] == firsts[j["run_stage"]]["id"], j
        assert j["outputs"] == firsts[j["run_stage"]]["outputs"]
    forced = api.post("/v1/runs", {**body, "force": True}, timeout=180).json()
    prep = next(j for j in forced["jobs"] if j["run_stage"] == "prepare")
    j = api.wait_job(prep["id"], timeout=120)
    assert j["status"] == "succeeded" and j["reused_from"] is None
    assert j["outputs"] != firsts["prepare"]["outputs"]
    api.post(f"/v1/runs/{forced['id']}/cancel")
