"""A team's first day through the real service: a GPU job or run stage with no node
to run on says so at once; names where users think in names; errors that name the cause. On
both backends (tests/conftest.py both_backends)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import wait_for
from tests.tiny import counting_records, ingested, tiny_target, write_jsonl

pytestmark = pytest.mark.both_backends


@pytest.fixture(scope="module")
def target(api, home):
    return tiny_target(api, home, "first-day")


@pytest.fixture(scope="module")
def dataset(api, home):
    return ingested(api, write_jsonl(home / "data" / "first-day.jsonl", counting_records(40)),
                    "first-day")


def test_a_gpu_job_with_no_node_for_it_says_why_at_once(api, worker):
    """It used to wait with no reason until a scheduler pass wrote one."""
    r = api.post("/v1/jobs", {"type": "probe", "gpus": 64,
                              "params": {"sleep_s": 0, "import_torch": False}})
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
    r = api.post("/v1/jobs", {"type": "probe", "params": {"sleep_s": 0, "import_torch": False}})
    assert r.status_code == 201 and r.json()["pending_reason"] is None, r.text


def test_the_plan_warns_of_a_gpu_stage_without_a_gpu_node_and_estimates_steps(
        api, worker, target, dataset):
    body = {"name": "p", "target_id": target["id"], "dataset_id": dataset["id"],
            "drafter": {"type": "dflash", "num_layers": 1, "draft_vocab_size": 256},
            "mode": "online",
            "stages": {"prepare": {"seq_length": 256}, "extract": None,
                       "train": {"gpus": 64, "epochs": 1, "max_steps": 30,
                                 "seq_length": 256}}}
    plan = api.post("/v1/plans", body, timeout=300)
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
    plan = api.post("/v1/plans", body, timeout=300)
    assert plan.status_code == 200 and plan.json()["ok"], plan.text
    r = api.post("/v1/runs", body, timeout=300)
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


def test_a_chat_template_that_is_a_file_name_is_refused_with_the_hint(api, target):
    for text in ("templates/qwen3.jinja", "chat.j2", " my_template.txt\n"):
        r = api.post("/v1/targets", {"name": "tmpl-path", "path": target["path"],
                                     "chat_template": text})
        assert r.status_code == 422, r.text
        e = r.json()["error"]
        assert e["param"] == "chat_template" and e["code"] == "template_is_a_path"
        assert "send the file's content" in e["message"] and text.strip() in e["message"]
    # a template whose text merely ends like that is a template
    r = api.post("/v1/targets", {"name": "tmpl-ok", "path": target["path"],
                                 "chat_template": "{{ messages[0]['content'] }} notes.txt"})
    assert r.status_code == 201, r.text
    # job params too
    r = api.post("/v1/jobs", {"type": "prepare", "params": {"chat_template": "t.jinja"},
                              "inputs": {"dataset": "ds_x", "target": target["id"]}})
    assert r.status_code == 422 and r.json()["error"]["param"] == "params.chat_template", r.text


def test_a_refused_plan_names_its_field_and_ranges_read_as_ranges(api, worker, target,
                                                                   dataset):
    body = {"name": "bad-layers", "target_id": target["id"], "dataset_id": dataset["id"],
            "drafter": {"type": "dflash", "num_layers": 1, "draft_vocab_size": 256},
            "stages": {"prepare": {"seq_length": 256},
                       "extract": {"dtype": "float32", "layer_ids": [1, 9]},
                       "train": {"max_steps": 2, "seq_length": 256}, "evaluate": None}}
    r = api.post("/v1/runs", body, timeout=300)
    assert r.status_code == 422, r.text
    e = r.json()["error"]
    assert e["param"] == "stages.extract.layer_ids", e
    assert "layers 0..7" in e["message"] and "[0, 7]" not in e["message"], e["message"]
    assert all(c.get("param") for c in e["details"]["checks"])


def test_an_unknown_format_names_the_cli_flag(api, home):
    p = home / "data" / "odd.jsonl"
    p.write_text('{"foo": 1}\n{"bar": 2}\n')
    d = api.post("/v1/datasets", {"name": "odd-shape", "path": str(p)}).json()
    d = wait_for(lambda: (x := api.get(f"/v1/datasets/{d['id']}").json())["status"]
                 != "ingesting" and x, 300, 0.3, "ingest")
    assert d["status"] == "failed" and "--format" in json.dumps(d["error"]), d


def test_the_server_starts_without_deprecation_warnings(database, tmp_path):
    """FastAPI's ORJSONResponse warned at every start (18 lines in the server log)."""
    import os
    import signal
    import subprocess
    import sys

    import httpx

    from tests.conftest import REPO, free_port

    port = free_port()
    log = tmp_path / "api.log"
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    with open(log, "wb") as fh:
        p = subprocess.Popen([sys.executable, "-m", "uvicorn", "app.main:create_app",
                              "--factory", "--host", "127.0.0.1", "--port", str(port),
                              "--log-level", "warning"], stdout=fh, stderr=subprocess.STDOUT,
                             cwd=REPO, env=env)
        try:
            def ready():
                try:
                    return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
                except httpx.HTTPError:
                    return None
            wait_for(ready, 60, 0.2, "the API to start")
            # an error answer and a listing render through the response class too
            assert httpx.get(f"http://127.0.0.1:{port}/v1/jobs").status_code == 401
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(20)
    text = log.read_text(errors="replace")
    assert "Deprecat" not in text, text[-3000:]
