"""The CLI's resource commands against the real API: `targets`, `datasets`, `artifacts`
(`pull ID DIR`), `users` (`add`), `webhooks`, and `--json` on every listing."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.service.test_cli import cli

# One test process builds the shared finished run (tests/service/conftest.py reported_run).
pytestmark = pytest.mark.xdist_group("reported_run")

LISTINGS = (["jobs"], ["runs"], ["queue"], ["nodes"], ["targets"], ["datasets"], ["artifacts"],
            ["users"])


def _json(api, *args):
    r = cli(api, *args, "--json")
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return json.loads(r.stdout)


def test_every_listing_has_json(api, reported_run):
    run = reported_run["run"]
    got = {a[0]: _json(api, *a) for a in LISTINGS}
    assert run["id"] in [r["id"] for r in got["runs"]]
    assert reported_run["target"]["id"] in [t["id"] for t in got["targets"]]
    assert reported_run["dataset"]["id"] in [d["id"] for d in got["datasets"]]
    assert reported_run["user"]["name"] in [u["name"] for u in got["users"]]
    assert set(got["queue"]) >= {"running", "waiting", "users"}
    assert any(n["name"] == "w1" for n in got["nodes"])
    assert all(isinstance(got[k], list) for k in got if k != "queue")
    # Tables show owners by name, not by id.
    r = cli(api, "runs")
    assert r.returncode == 0 and reported_run["user"]["name"] in r.stdout, r.stdout
    r = cli(api, "targets")
    assert r.returncode == 0 and "tiny-report" in r.stdout, r.stdout
    r = cli(api, "datasets")
    assert r.returncode == 0 and "report-chat" in r.stdout, r.stdout


def test_artifacts_pull_and_users_add(api, reported_run, tmp_path):
    rep = api.get(f"/v1/runs/{reported_run['run']['id']}/report").json()
    drafter = rep["drafter"]["artifact_id"]
    arts = _json(api, "artifacts", "--kind", "drafter")
    assert drafter in [a["id"] for a in arts]
    r = cli(api, "artifacts", "pull", drafter, str(tmp_path / "d"))
    assert r.returncode == 0 and f"pulled {drafter}" in r.stdout, r.stdout + r.stderr
    files = api.get(f"/v1/artifacts/{drafter}").json()["files"]
    for f in files:
        assert (tmp_path / "d" / f["path"]).stat().st_size == f["bytes"]
    r = cli(api, "artifacts", "pull", "art_nope", str(tmp_path / "x"))
    assert r.returncode == 1 and "not_found" in r.stdout

    name = f"cli-{uuid.uuid4().hex[:6]}"
    r = cli(api, "users", "add", name)
    assert r.returncode == 0 and f"user {name}" in r.stdout, r.stdout
    token = r.stdout.split("token (shown once): ")[1].split()[0]
    me = api.as_(token).get("/v1/users/me").json()
    assert me["name"] == name and me["role"] == "member"
    r = cli(api, "users", "add", name)  # the name is taken: one red line, exit 1
    assert r.returncode == 1 and "name_taken" in r.stdout, r.stdout


def test_webhooks_commands(api, worker):
    """The CLI against POST/GET/DELETE /v1/webhooks."""
    r = cli(api, "webhooks", "add", "http://127.0.0.2:9/hook", "--event", "job.succeeded",
            "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    hook = json.loads(r.stdout)
    assert hook["url"] == "http://127.0.0.2:9/hook" and hook.get("secret")
    assert hook["id"] in [h["id"] for h in _json(api, "webhooks")]
    assert isinstance(_json(api, "webhooks", "deliveries", hook["id"]), list)
    r = cli(api, "webhooks", "rm", hook["id"])
    assert r.returncode == 0, r.stdout
    assert hook["id"] not in [h["id"] for h in _json(api, "webhooks")]
