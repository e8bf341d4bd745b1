"""Storage on the session's finished run (tests/service/conftest.py reported_run): retention
deleted its hidden states once train succeeded (a tombstone the report still lists), each
succeeded job's scratch is gone, and GET /v1/storage, `draftyard storage` and the
dashboard's storage view (headless Chromium, screenshot under tmp/artifacts/storage/) say
who uses the disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.service.test_cli import cli
from tests.service.browser import ARTIFACTS, shoot

pytestmark = pytest.mark.xdist_group("reported_run")


def _run_artifacts(api, run) -> dict[str, dict]:
    """The last artifact each of the run's jobs made, by stage."""
    return {s: arts[-1] for s, arts in _all_artifacts(api, run).items()}


def _all_artifacts(api, run) -> dict[str, list[dict]]:
    """Every artifact the run's jobs made, by stage (split makes two)."""
    out: dict[str, list[dict]] = {}
    for j in run["jobs"]:
        for a in api.job(j["id"])["outputs"]:
            out.setdefault(j["run_stage"], []).append(api.get(f"/v1/artifacts/{a}").json())
    return out


def test_retention_deleted_the_runs_hidden_states_after_train(api, reported_run, home):
    from app.core.db import unit_of_work
    from app.models import Job

    run = reported_run["run"]
    arts = _run_artifacts(api, run)
    hs = arts["extract"]
    assert hs["kind"] == "hidden_states"
    assert hs["deleted_at"] and hs["deleted_by"] == "retention", hs
    assert hs["bytes_freed"] == hs["bytes"] > 0 and not Path(hs["uri"]).exists()
    for stage in ("prepare", "train", "evaluate"):  # the rest stays
        assert arts[stage]["deleted_at"] is None and Path(arts[stage]["uri"]).is_dir()
    # The report still reads its lineage, the tombstone included.
    rep = api.get(f"/v1/runs/{run['id']}/report").json()
    assert hs["id"] in [a["id"] for a in rep["lineage"]]
    # Succeeded jobs' scratch is removed when they end; its size is recorded.
    with unit_of_work(read_only=True) as s:
        for j in run["jobs"]:
            job = s.get(Job, j["id"])
            assert job.scratch_removed_at is not None, j["run_stage"]
            assert not (home / "jobs" / j["id"] / "work").exists()
    train = next(j for j in run["jobs"] if j["run_stage"] == "train")
    assert (home / "jobs" / train["id"] / "log.txt").exists()  # the log outlives scratch


def test_storage_usage_by_kind_owner_and_run(api, reported_run):
    run, user = reported_run["run"], reported_run["user"]
    u = api.get("/v1/storage").json()
    assert sum(k["bytes"] for k in u["by_kind"]) == u["artifacts"]["bytes"] > 0
    assert sum(o["bytes"] for o in u["by_owner"]) == u["artifacts"]["bytes"]
    live = [a for arts in _all_artifacts(api, run).values() for a in arts if not a["deleted_at"]]
    row = next(r for r in u["by_run"] if r["run_id"] == run["id"])
    assert row["bytes"] == sum(a["bytes"] for a in live) and row["name"] == run["name"]
    assert row["count"] == len(live)
    mine = next(o for o in u["by_owner"] if o["owner"] == user["id"])
    assert mine["name"] == user["name"] and mine["bytes"] >= row["bytes"]
    assert u["deleted"]["bytes_freed"] >= _run_artifacts(api, run)["extract"]["bytes_freed"]
    vols = {v["name"]: v for v in u["volumes"]}
    assert set(vols) == {"artifacts", "scratch"}
    for v in vols.values():
        assert v["total_bytes"] > v["free_bytes"] >= v["free_after_reservations_bytes"] >= 0

    r = cli(api, "storage")
    assert r.returncode == 0, r.stdout + r.stderr
    for word in ("volumes", "by kind", "by owner", "by run", run["id"], user["name"],
                 "reclaimable now"):
        assert word in r.stdout, word
    (ARTIFACTS / "storage").mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "storage" / "draftyard-storage.txt").write_text(r.stdout)
    r = cli(api, "storage", "prune", "--dry-run")
    assert r.returncode == 0 and "would free" in r.stdout, r.stdout + r.stderr


def test_storage_view_in_chromium(api, server, reported_run, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    d, run = browser, reported_run["run"]
    d.get(f"{server}/ui")
    d.execute_script("localStorage.setItem('draftyard_token', arguments[0])", api.token)
    d.get(f"{server}/ui#storage")
    d.refresh()
    WebDriverWait(d, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".vol"))
    main = d.find_element(By.TAG_NAME, "main").text
    nav = d.find_element(By.ID, "nav").text
    assert "storage" in nav
    for word in ("artifacts", "scratch", "free after reservations", "by kind", "by owner",
                 "by run", "reclaimable now", run["name"], "drafter"):
        assert word in main, word
    shoot(d, "storage", "storage-view", min_bytes=10_000)
