"""The run report people read, in a real headless Chromium (Debian's `chromium` and
`chromium-driver`, driven by selenium) on the dashboard's run page, and in
`draftyard runs show`. Screenshots are kept under tmp/artifacts/run-report/ (or
$DRAFTYARD_TEST_ARTIFACTS): look at them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.service.browser import ARTIFACTS, shoot
from tests.service.test_cli import cli

# One test process builds the shared finished run (tests/service/conftest.py reported_run).
pytestmark = pytest.mark.xdist_group("reported_run")

SHOTS = ARTIFACTS / "run-report"


def _shoot(d, name: str) -> Path:
    return shoot(d, "run-report", name, min_bytes=10_000)


def test_run_page_in_chromium(api, server, reported_run, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    d, run, user = browser, reported_run["run"], reported_run["user"]
    d.get(f"{server}/ui")
    d.execute_script("localStorage.setItem('draftyard_token', arguments[0])", reported_run["token"])
    d.get(f"{server}/ui#run/{run['id']}")
    d.refresh()
    wait = WebDriverWait(d, 30)
    wait.until(lambda d: d.find_elements(By.ID, "lineage"))
    wait.until(lambda d: d.execute_script(
        "const i = document.getElementById('eval-plot'); return i && i.complete && i.naturalWidth"))
    el = {i: d.find_element(By.ID, i) for i in (
        "verdict", "tau", "per-position-chart", "loss-chart", "acceptance-curve", "eval-plot",
        "serve-command", "copy-serve", "lineage", "run-owner")}
    # what the page's viewer (the run's owner, a member) reads: server folders as labels
    rep = api.as_(reported_run["token"]).get(f"/v1/runs/{run['id']}/report").json()
    ev = rep["evaluation"]

    # Verdict first: above everything else the report shows.
    assert el["verdict"].text.lower().startswith(f"verdict: {ev['verdict']}")
    assert all(el["verdict"].location["y"] < el[k].location["y"] for k in
               ("tau", "per-position-chart", "loss-chart", "eval-plot", "lineage"))
    assert f"{ev['tau']:.2f}" in el["tau"].text and f"{ev['tau_baseline']:.2f}" in el["tau"].text
    # Charts with axes, axis titles and units; bars per position for trained and untrained.
    pp = el["per-position-chart"]
    assert pp.find_element(By.CSS_SELECTOR, ".x-label").text == "draft position k"
    assert "accepted" in pp.find_element(By.CSS_SELECTOR, ".y-label").text
    assert len(pp.find_elements(By.CSS_SELECTOR, "rect[height]")) >= \
        len(rep["per_position"]["trained"]) + len(rep["per_position"]["untrained"])
    assert pp.find_elements(By.CSS_SELECTOR, ".x-axis") and pp.find_elements(By.CSS_SELECTOR, ".y-axis")
    labels = [t.text for t in pp.find_elements(By.CSS_SELECTOR, ".bar-value")]
    assert labels[0] == f"{round(rep['per_position']['trained'][0] * 100)}%", labels
    loss = el["loss-chart"]
    assert loss.find_element(By.CSS_SELECTOR, ".x-label").text == "optimizer step"
    assert "nats" in loss.find_element(By.CSS_SELECTOR, ".y-label").text
    assert loss.find_elements(By.CSS_SELECTOR, "polyline")
    assert el["acceptance-curve"].find_elements(By.CSS_SELECTOR, "polyline")
    assert d.execute_script("return document.getElementById('eval-plot').naturalWidth") >= 400
    # The serve command and its copy button (listener, not an inline handler).
    assert el["serve-command"].text == rep["drafter"]["serve_command"]
    assert el["copy-serve"].get_attribute("onclick") is None
    el["copy-serve"].click()
    wait.until(lambda d: d.find_element(By.ID, "copy-serve").text == "Copied")
    # Lineage: every artifact, with its dataset, template hash and target; owner by name.
    rows = el["lineage"].find_elements(By.CSS_SELECTOR, "tr")[1:]
    assert len(rows) == len(rep["lineage"]) >= 5
    for row, a in zip(rows, rep["lineage"]):
        assert a["id"] in row.text and "report-chat" in row.text and "tiny-report" in row.text
        if a["chat_template_sha256"]:
            assert a["chat_template_sha256"][:12] in row.text
    assert el["run-owner"].text == user["name"]
    assert "usr_" not in d.find_element(By.TAG_NAME, "main").text
    _shoot(d, "run-page")

    d.get(f"{server}/ui#runs")  # the list links to the page and names owners too
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f"a[href='#run/{run['id']}']"))
    assert user["name"] in d.find_element(By.TAG_NAME, "main").text
    _shoot(d, "runs-list")


def test_run_follow_then_runs_in_the_terminal(api, reported_run):
    """The shared run was submitted with `draftyard run --follow` (conftest.py): what it
    printed while following, then `draftyard runs` listing it."""
    run, out = reported_run["run"], reported_run["cli_follow"]
    assert "prepare -> extract -> train -> evaluate" in out, out
    assert f"run {run['id']}: succeeded" in out, out
    r = cli(api.as_(reported_run["token"]), "runs")
    assert r.returncode == 0 and run["id"] in r.stdout and "train:succeeded" in r.stdout, r.stdout


def test_runs_show_in_the_terminal(api, reported_run):
    run, user = reported_run["run"], reported_run["user"]
    r = cli(api, "runs", "show", run["id"])
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    rep = api.get(f"/v1/runs/{run['id']}/report").json()
    ev = rep["evaluation"]
    lines = out.splitlines()
    assert lines[1].startswith(f"VERDICT: {ev['verdict'].upper()}"), out  # after the title
    assert f"owner {user['name']}" in lines[0]
    assert f"trained {ev['tau']:.2f} vs untrained {ev['tau_baseline']:.2f}" in out
    # The free baseline beside them, from the evaluate stage's report.json.
    assert ev["tau_prompt_lookup"] is not None and rep["per_position"]["prompt_lookup"]
    assert f"vs prompt lookup {ev['tau_prompt_lookup']:.2f}" in out
    assert "prompt lookup" in ev["verdict_reason"]
    assert "acceptance per draft position" in out and "P(first k drafts accepted)" in out
    assert "training loss (cross-entropy, nats)" in out and " step" in out
    assert rep["drafter"]["serve_command"] in out.replace("\n", "")
    assert "lineage of every artifact" in out
    for a in rep["lineage"]:
        assert a["id"] in out
    (SHOTS).mkdir(parents=True, exist_ok=True)
    (SHOTS / "runs-show.txt").write_text(out)
    r = cli(api, "runs", "show", "run_nope")
    assert r.returncode == 1 and "not_found" in r.stdout


def test_the_demo_prints_the_same_report(api, reported_run, capsys):
    """`draftyard demo` ends with this report too (app/cli/demo.py); checked here on the
    session's run, since the demo itself takes minutes."""
    from app.cli import demo
    from draftyard import Client

    run = reported_run["run"]
    arts = demo.print_report(Client(api.url, reported_run["token"]), run)
    out = " ".join(capsys.readouterr().out.split())  # the console wraps at 80 columns
    assert set(arts) == {"split", "prepare", "extract", "train", "evaluate"}
    assert {k: v["id"] for k, v in arts.items()} == {j["run_stage"]: j["outputs"][-1]
                                                      for j in run["jobs"]}
    assert "VERDICT: " in out and "acceptance per draft position" in out
    assert "vllm serve" in out and f"draftyard runs show {run['id']}" in out
