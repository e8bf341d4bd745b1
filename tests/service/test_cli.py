"""The CLI's dataset/plan/run/runs commands against the real API, worker and a tiny target:
what a user types, what they read, and the exit codes scripts rely on; on both backends
(tests/conftest.py both_backends)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.service.test_runs import _body as run_body
from tests.tiny import tiny_target

pytestmark = pytest.mark.both_backends


def cli(api, *args, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "DRAFTYARD_URL": api.url, "DRAFTYARD_TOKEN": api.token,
           "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "app.cli.main", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tiny(api, home):
    return tiny_target(api, home, "tiny-cli")


def test_dataset_upload_reports_format_counts_and_rejected_lines(api, worker, tmp_path):
    f = tmp_path / "mixed.jsonl"
    f.write_text("\n".join([
        json.dumps({"instruction": "Add 2 and 2.", "input": "", "output": "4"}),
        '{"instruction": "broken',
        json.dumps({"instruction": "Name a colour.", "output": "Blue."}),
        json.dumps({"prompt": "only a prompt"}),
    ]) + "\n")
    r = cli(api, "dataset", str(f), "--name", "cli-mixed")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cli-mixed: format alpaca, 3 records (1 prompt-only" in r.stdout, r.stdout
    assert "1 rejected" in r.stdout and "line 2: invalid JSON" in r.stdout, r.stdout
    r = cli(api, "dataset", str(tmp_path / "nope.jsonl"))
    assert r.returncode == 2 and "no such file" in r.stdout


def _body(target, ds_id: str, **train) -> dict:
    body = run_body(target, {"id": ds_id}, name="cli-run")
    body["stages"]["train"].update(max_steps=3, **train)
    return body


@pytest.mark.postgres_only("13 CPU-s of CLI processes and plans: the CLI only speaks HTTP, and "
                           "test_runs.py's plan refusals run on both backends")
def test_plan_and_run_refusals(api, worker, tiny, tmp_path):
    f = tmp_path / "chat.jsonl"
    f.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"count to {i}"},
        {"role": "assistant", "content": " ".join(str(k) for k in range(i + 3))}]}) + "\n"
        for i in range(8)))
    r = cli(api, "dataset", str(f), "--name", "cli-chat")
    assert r.returncode == 0, r.stdout + r.stderr
    ds_id = next(d for d in api.get("/v1/datasets", params={"limit": 100}).json()["data"]
                 if d["name"] == "cli-chat")["id"]

    bad = tmp_path / "bad.json"
    body = _body(tiny, ds_id)
    body["drafter"]["target_layer_ids"] = [1, 42]
    bad.write_text(json.dumps(body))
    r = cli(api, "plan", str(bad))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "ERR layer_ids" in r.stdout and "has errors" in r.stdout, r.stdout
    r = cli(api, "run", str(bad))  # refused, with the plan shown
    assert r.returncode == 1 and "refused" in r.stdout and "ERR layer_ids" in r.stdout, r.stdout

    good = tmp_path / "good.json"
    good.write_text(json.dumps(_body(tiny, ds_id)))
    r = cli(api, "plan", str(good))
    assert r.returncode == 0 and "plan (" in r.stdout and "ok" in r.stdout, r.stdout
    # `draftyard run --follow` to the end: the session's shared run is submitted that way
    # (tests/service/conftest.py reported_run; test_run_report.py reads what it printed).

    broken = tmp_path / "broken.json"
    broken.write_text('{"name": "x",\n "target_id": }')
    r = cli(api, "run", str(broken))
    assert r.returncode == 2 and "line 2" in r.stdout, r.stdout
    body = _body(tiny, ds_id, lr=-1)
    bad.write_text(json.dumps(body))
    r = cli(api, "run", str(bad))
    assert r.returncode == 2 and "stages.train" in r.stdout, r.stdout


def test_unreachable_api_is_one_line_not_a_traceback(tmp_path):
    from tests.conftest import free_port

    dead = type("A", (), {"url": f"http://127.0.0.1:{free_port()}", "token": "x"})()
    (tmp_path / "run.json").write_text("{}")
    for args in (["jobs"], ["runs"], ["plan", str(tmp_path / "run.json")]):
        r = cli(dead, *args, timeout=60)
        assert r.returncode == 3, (args, r.stdout, r.stderr)
        assert "cannot reach the draftyard API at http://127.0.0.1:" in r.stdout, r.stdout
        assert "Traceback" not in r.stdout + r.stderr and "──" not in r.stdout + r.stderr
