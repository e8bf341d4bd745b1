"""The Python client (`from draftyard import Client`) against the real API and worker: typed
errors carrying the API's error object, jobs (wait, live events, logs, metrics), uploads with
progress, the run report and pulling a drafter folder; and that it is the tree's one HTTP
client."""

from __future__ import annotations

import ast
import hashlib
import json
import uuid

import pytest

from draftyard import (ApiError, Client, Conflict, Forbidden, NotFound, Unauthorized,
                       Unprocessable)
from tests.conftest import REPO

# One test process builds the shared finished run (tests/service/conftest.py reported_run).
pytestmark = pytest.mark.xdist_group("reported_run")


def test_errors_are_typed_and_carry_the_api_error_object(api, worker):
    c = Client(api.url, api.token)
    with pytest.raises(NotFound) as e:
        c.get_job("job_doesnotexist")
    assert e.value.status == 404 and e.value.code == "not_found" and e.value.param == "id"
    assert "job_doesnotexist" in e.value.message and e.value.request_id
    with pytest.raises(Unprocessable) as e:
        c.submit_job("probe", params={"sleep_s": "soon"})
    assert e.value.status == 422 and "sleep_s" in (e.value.param or "") + e.value.message
    assert e.value.error["code"] == e.value.code
    with pytest.raises(Unauthorized):
        Client(api.url, "not-a-token").list_jobs()
    member = Client(api.url, c.create_user(f"m-{uuid.uuid4().hex[:6]}")["token"])
    with pytest.raises(Forbidden) as e:
        member.create_user("someone")
    assert e.value.status == 403
    job = c.submit_job("probe", params={"steps": 2, "import_torch": False})
    assert c.wait_job(job["id"], timeout=60)["status"] == "succeeded"
    with pytest.raises(Conflict) as e:
        c.cancel_job(job["id"])
    assert e.value.status == 409 and isinstance(e.value, ApiError)


def test_job_wait_follow_events_logs_and_metrics(api, worker):
    c = Client(api.url, api.token)
    job = c.submit_job("probe", name="client-probe",
                       params={"sleep_s": 0.6, "steps": 3, "import_torch": False})
    events = list(c.follow_events(job["id"]))  # the SSE stream ends with the job
    kinds = [e["kind"] for e in events]
    assert "status" in kinds and "progress" in kinds, kinds
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)
    assert events[-1]["kind"] == "status" or c.get_job(job["id"])["status"] == "succeeded"
    final = c.wait_job(job["id"], timeout=30)
    assert final["status"] == "succeeded" and final["progress"]["done"] == 3
    assert [e["seq"] for e in c.events(job["id"])] == [e["seq"] for e in events]
    assert isinstance(c.logs(job["id"]), str)
    assert [s for s, _ in c.metrics(job["id"])["tick"]] == [1, 2, 3]
    assert job["id"] in [j["id"] for j in c.list_jobs(type="probe", limit=100)["data"]]


def test_upload_progress_report_and_pull_a_drafter(api, reported_run, tmp_path):
    size = reported_run["file"].stat().st_size
    seen = reported_run["upload_progress"]
    assert seen and seen[-1] == (size, size), seen[-3:]
    assert [n for n, _ in seen] == sorted(n for n, _ in seen)

    c = Client(api.url, reported_run["token"])
    run = reported_run["run"]
    rep = c.run_report(run["id"])
    assert rep["run"]["owner"]["name"] == reported_run["user"]["name"]
    assert rep["evaluation"]["verdict"] in ("accept", "reject")
    assert isinstance(rep["evaluation"]["tau"], float) and rep["evaluation"]["tau"] >= 1
    assert rep["evaluation"]["tau_baseline"] is not None
    assert rep["per_position"]["trained"] and rep["per_position"]["untrained"]
    assert len(rep["curves"]["series"]["loss"]) >= 2
    assert [p["path"] for p in rep["plots"]] == ["acceptance.png"]
    assert rep["drafter"]["serve_command"].startswith("vllm serve")
    kinds = {a["kind"] for a in rep["lineage"]}
    assert {"dataset", "tokenized", "hidden_states", "drafter", "eval_report"} <= kinds, kinds
    assert rep["lineage"][0]["id"] == reported_run["dataset"]["artifact_id"]  # the root
    assert rep["lineage"][0]["stage"] == "input"
    for a in rep["lineage"]:
        assert a["dataset"]["name"] == "report-chat" and a["target"]["name"] == "tiny-report"
        if a["kind"] != "dataset":  # rendered with a chat template: prepare and after
            assert len(a["chat_template_sha256"] or "") == 64, a
    by_id = {a["id"]: a for a in rep["lineage"]}
    for a in rep["lineage"][1:]:  # every made artifact comes from earlier ones of the run
        arts = [i for i in a["inputs"] if i.startswith("art_")]
        assert arts and all(i in by_id for i in arts), a

    drafter = rep["drafter"]["artifact_id"]
    art = c.get_artifact(drafter)
    got: list[int] = []
    out = c.pull_artifact(drafter, tmp_path / "drafter", lambda n, t: got.append(n))
    assert got[-1] == sum(f["bytes"] for f in art["files"])
    for f in art["files"]:
        p = out / f["path"]
        assert p.stat().st_size == f["bytes"], f
        if f.get("sha256"):
            assert hashlib.sha256(p.read_bytes()).hexdigest() == f["sha256"]
    assert (out / "config.json").is_file()
    assert json.loads((out / "artifact.json").read_text())["id"] == drafter
    with pytest.raises(NotFound):
        c.download_file(drafter, "../../etc/passwd", tmp_path / "x")


def test_the_client_is_the_one_http_client():
    """Outside the client, app/ and draftyard/ make no HTTP calls of their own (the CLI may
    name httpx's transport error to say the API is unreachable)."""
    offenders = []
    # The webhook sender POSTs to the users' own receivers: an outbound notifier, not a
    # client of draftyard's API.
    # the webhook URL check parses with httpx.URL so that it reads a URL as the sender will
    exempt = {REPO / "draftyard" / "client.py", REPO / "app" / "webhooks" / "sender.py",
              REPO / "app" / "webhooks" / "service.py"}
    for f in sorted([*(REPO / "app").rglob("*.py"), *(REPO / "draftyard").rglob("*.py")]):
        if f in exempt:
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "httpx" and node.attr != "TransportError":
                offenders.append(f"{f.relative_to(REPO)}:{node.lineno} httpx.{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.split(".")[0] in ("requests", "urllib3", "aiohttp"):
                offenders.append(f"{f.relative_to(REPO)}:{node.lineno} {node.module}")
    assert not offenders, offenders
    assert not (REPO / "app" / "cli" / "client.py").exists()
