"""The run report beyond the first run (tests/service/test_run_report.py): a run whose stages
were all satisfied by reuse reads as reused, naming the jobs it reused, in the API, in
`draftyard runs show` and on the dashboard, with the same numbers as the run that did the
work; evaluate's progress names its phases; the evaluation data is named by its dataset and
a mixed evaluation set gets tau per source."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.conftest import REPO
from tests.service.browser import ARTIFACTS, shoot
from tests.service.test_cli import cli

pytestmark = pytest.mark.xdist_group("reported_run")


@pytest.fixture(scope="module")
def reused_run(api, reported_run) -> dict:
    """The shared run's body submitted twice more by its owner, with `keep`. The first run's
    hidden states went to retention (app/storage/retention.py), so the second reuses split and
    prepare and makes the rest again; the third reuses every stage."""
    import time

    from draftyard import Client

    c = Client(api.url, reported_run["token"], timeout=180)
    runs = []
    for name in ("report-run-again", "report-run-third"):
        t0 = time.monotonic()
        run = c.wait_run(c.create_run({**reported_run["body"], "name": name,
                                       "keep": True})["id"], timeout=300)
        assert run["status"] == "succeeded", run["stages"]
        print(f"{name}: {time.monotonic() - t0:.1f} s")
        runs.append(run)
    return {"first": c.get_run(reported_run["run"]["id"]), "second": runs[0], "run": runs[1],
            "client": c, "dataset": reported_run["dataset"]}


def _did(run: dict) -> dict[str, str]:
    """stage -> the job that did its work (itself, or the one it reused)."""
    return {j["run_stage"]: j["reused_from"] or j["id"] for j in run["jobs"]}


def test_a_reused_run_reads_as_reused_with_the_work_of_the_first(reused_run):
    first, second, run = reused_run["first"], reused_run["second"], reused_run["run"]
    c = reused_run["client"]
    assert {j["run_stage"]: j["reused_from"] for j in second["jobs"]} == {
        "split": _did(first)["split"], "prepare": _did(first)["prepare"], "extract": None,
        "train": None, "evaluate": None}
    did = _did(second)
    rep, rep0 = c.run_report(run["id"]), c.run_report(second["id"])
    assert [(s["stage"], s["reused_from"]) for s in rep["stages"]] == \
        [(s, did[s]) for s in ("split", "prepare", "extract", "train", "evaluate")]
    # The numbers are those of the run that did the work: its evaluate report, drafter,
    # curves and lineage.
    assert rep["per_position"] == rep0["per_position"] and rep["per_position"]["trained"]
    assert rep["evaluation"]["tau"] == rep0["evaluation"]["tau"]
    assert rep["evaluation"]["data"] == rep0["evaluation"]["data"] is not None
    # The shared run evaluates on its split's held-out part: named by the dataset it came from.
    ds = reused_run["dataset"]
    assert rep["evaluation"]["data"]["made_from"] == {"id": ds["id"], "name": ds["name"]}
    assert rep["drafter"] == rep0["drafter"] is not None
    assert rep["curves"]["series"] == rep0["curves"]["series"] and rep["curves"]["series"]
    assert [(a["id"], a["stage"]) for a in rep["lineage"]] == \
        [(a["id"], a["stage"]) for a in rep0["lineage"]]
    assert rep["plots"] == rep0["plots"] != []


def test_runs_show_names_the_reused_jobs(api, reported_run, reused_run):
    first, run = reused_run["second"], reused_run["run"]
    r = cli(api.as_(reported_run["token"]), "runs", "show", run["id"])
    assert r.returncode == 0, r.stdout + r.stderr
    stage_lines = [ln for ln in r.stdout.splitlines() if ln.startswith("  ") and " job_" in ln
                   and ln.split()[0] in ("split", "prepare", "extract", "train", "evaluate")]
    did = _did(first)
    (ARTIFACTS / "run-report").mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "run-report" / "runs-show-reused.txt").write_text(r.stdout)
    assert len(stage_lines) == 5, r.stdout
    for ln in stage_lines:
        assert f"reused from {did[ln.split()[0]]}" in ln and "attempt" not in ln, ln
    # A run that did its work says which attempt did it.
    r = cli(api.as_(reported_run["token"]), "runs", "show", reported_run["run"]["id"])
    assert "attempt 1" in r.stdout and "reused from" not in r.stdout, r.stdout


def test_evaluate_progress_names_its_phases(api, reported_run):
    """The shared run's evaluate went through its phases (reference answers, target alone,
    with the drafter, with the baseline, with the prompt lookup, tau_sim, tau_sim baseline):
    the job's progress names the last one and its place, and `draftyard run --follow` showed it."""
    run = reported_run["run"]
    ev = next(j for j in run["jobs"] if j["run_stage"] == "evaluate")
    p = api.get(f"/v1/jobs/{ev['id']}").json()["progress"]
    assert (p["phase"], p["phase_index"], p["phases"]) == ("tau_sim baseline", 7, 7), p
    assert p["stage"] == "evaluate: tau_sim baseline (7/7)" and p["done"] == p["total"]
    rows = api.get(f"/v1/jobs/{ev['id']}/events?limit=1000").json()["data"]
    phases = [e["data"].get("phase") for e in rows if e["kind"] == "progress"]
    assert phases[0] == "reference answers" and phases[-1] == "tau_sim baseline", phases
    assert "tau_sim baseline (7/7)" in " ".join(reported_run["cli_follow"].split()), \
        reported_run["cli_follow"]


def test_dashboard_run_page_shows_reused_stages_and_the_data(server, reported_run,
                                                             reused_run, browser):
    """Reused stages as reused (with the job); the evaluation data and the tau-by-source
    table as the page renders them from the report (the shared run evaluates on one
    dataset's held-out part: the page is given a mixed set's report fields here; the
    numbers themselves are checked in tests/stages/test_evaluate_phases.py and below)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    d, run = browser, reused_run["run"]
    did = _did(reused_run["second"])
    extra = {"by_source": {"humaneval": {"prompts": 3, "tau": 2.5, "tau_baseline": 1.0},
                           "sharegpt": {"prompts": 5, "tau": 1.75, "tau_baseline": 1.0}},
             "data": {"artifact_id": "art_x", "kind": "dataset",
                      "dataset": {"id": "ds_x", "name": "eval-mixed48"}}}
    d.get(f"{server}/ui")
    d.execute_script("localStorage.setItem('draftyard_token', arguments[0])",
                     reported_run["token"])
    d.get(f"{server}/ui#run/{run['id']}")
    d.refresh()
    wait = WebDriverWait(d, 30)
    wait.until(lambda d: d.find_elements(By.ID, "lineage"))
    for stage, job in did.items():
        chip = next(a for a in d.find_elements(By.CSS_SELECTOR, "a.stage")
                    if a.text.startswith(stage))
        assert f"reused from {job}" in chip.text and "attempt" not in chip.text, chip.text
    assert not d.find_elements(By.ID, "by-source")  # one source: no split
    d.execute_script("""const extra = arguments[0], f = window.fetch;
      window.fetch = async (u, o) => {
        const r = await f(u, o);
        if (!String(u).endsWith('/report')) return r;
        const j = await r.json();
        Object.assign(j.evaluation, extra);
        return new Response(JSON.stringify(j), {headers: {'content-type': 'application/json'}});
      };
      go();  // a finished run's page is drawn once: draw it again""", extra)
    wait.until(lambda d: d.find_elements(By.ID, "by-source"))
    rows = [r.text for r in d.find_elements(By.CSS_SELECTOR, "#by-source tr")[1:]]
    assert rows == ["humaneval 3 2.50 1.00", "sharegpt 5 1.75 1.00"], rows
    data = d.find_element(By.ID, "eval-data").text
    assert "eval-mixed48" in data and "ds_x" in data, data
    shoot(d, "run-report", "reused-run-page", min_bytes=10_000)


# The dashboard's scripts run in node on stub browser globals: RENDER.run(id) builds the run
# page's HTML from what `fetch` answers (here the API's real answers, captured above), where
# Chromium is missing (the test above needs it).
NODE_PAGE = """
const vm = require("vm"), fs = require("fs");
const [dir, id, answers] = [process.argv[1], process.argv[2], JSON.parse(process.argv[3])];
const el = () => ({innerHTML: "", textContent: "", dataset: {}, addEventListener() {},
                   querySelector() { return null; }});
const ctx = {console, setInterval, clearInterval, setTimeout, Promise, JSON, Date, Math,
  location: {hash: "", host: "test"}, localStorage: {getItem: () => "", setItem() {}},
  document: {getElementById: el, addEventListener() {}, body: {dataset: {}}},
  window: {addEventListener() {}},
  fetch: async u => { const path = String(u).split("?")[0];
    if (!(path in answers)) return {ok: false, status: 404, headers: {get: () => "json"},
                                    json: async () => ({error: {message: path}})};
    return {ok: true, status: 200, headers: {get: () => "application/json"},
            json: async () => answers[path]}; }};
vm.createContext(ctx);
for (const f of ["storage.js", "app.js", "actions.js"])
  vm.runInContext(fs.readFileSync(`${dir}/${f}`, "utf8"), ctx, {filename: f});
vm.runInContext(`RENDER.run(${JSON.stringify(id)})`, ctx).then(
  html => console.log(html.replace(/<[^>]+>/g, " ").replace(/\\s+/g, " ")),
  e => { console.error(e); process.exit(1); });
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is needed to run app.js")
def test_dashboard_run_page_text_in_node(api, reported_run, reused_run):
    c, run = reused_run["client"], reused_run["run"]
    rep = c.run_report(run["id"])
    rep["evaluation"].update({
        "by_source": {"humaneval": {"prompts": 3, "tau": 2.5, "tau_baseline": 1.0},
                      "sharegpt": {"prompts": 5, "tau": 1.75, "tau_baseline": 1.0}},
        "data": {"artifact_id": "art_x", "kind": "dataset",
                 "dataset": {"id": "ds_x", "name": "eval-mixed48"}}})
    me = api.as_(reported_run["token"]).get("/v1/users/me").json()
    answers = {f"/v1/runs/{run['id']}/report": rep, f"/v1/runs/{run['id']}": c.get_run(run["id"]),
               "/v1/users/me": me}
    out = subprocess.run(["node", "-e", NODE_PAGE, str(REPO / "app" / "dashboard"), run["id"],
                          json.dumps(answers)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for stage, job in _did(reused_run["second"]).items():
        assert f"{stage} succeeded reused from {job}" in text, text
    assert "attempt" not in text, text
    assert "evaluation data eval-mixed48 ds_x, art_x" in text, text
    assert "tau by source" in text and "humaneval 3 2.50 1.00" in text \
        and "sharegpt 5 1.75 1.00" in text, text


def test_report_names_the_dataset_and_splits_tau_by_source(db, user, tmp_path):
    """build_report on rows as a run leaves them: evaluate measured a dataset's artifact and
    its report.json splits tau by source; the report names the dataset and carries the
    split, and `runs show` prints both."""
    from app.cli.report import print_report
    from app.core.ids import new_id
    from app.models import Artifact, Dataset, Job, Run
    from app.runs.report import build_report

    data = Artifact(id=new_id("art"), kind="dataset", uri=str(tmp_path / "d"))
    ds = Dataset(id=new_id("ds"), name="eval-mixed48", owner_id=user.id, status="ready",
                 artifact_id=data.id)
    run = Run(id=new_id("run"), name="r", owner_id=user.id, status="succeeded",
              spec={"drafter": {"type": "dflash"}})
    job = Job(id=new_id("job"), type="evaluate", owner_id=user.id, status="succeeded",
              priority=50, gpus_requested=0, run_id=run.id, run_stage="evaluate")
    folder = tmp_path / "report"
    folder.mkdir()
    by = {"humaneval": {"prompts": 24, "tau": 3.1, "tau_baseline": 1.0, "steps": 700},
          "sharegpt": {"prompts": 24, "tau": 1.9, "tau_baseline": 1.0, "steps": 1200}}
    (folder / "report.json").write_text(json.dumps({"tau": 2.3, "by_source": by}))
    rep_art = Artifact(id=new_id("art"), kind="eval_report", uri=str(folder),
                       producer_job=job.id, inputs=[data.id, "art_drafter"])
    job.outputs = [rep_art.id]
    db.add_all([data, ds, run])
    db.flush()
    db.add_all([job, rep_art])
    db.flush()

    ev = build_report(db, run)["evaluation"]
    assert ev["data"] == {"artifact_id": data.id, "kind": "dataset",
                          "dataset": {"id": ds.id, "name": "eval-mixed48"}, "made_from": None}
    assert ev["by_source"] == by
    from rich.console import Console

    con = Console(record=True, width=160, file=open("/dev/null", "w"))  # noqa: SIM115
    print_report(build_report(db, run), log=con.print)
    text = con.export_text()
    assert f"evaluation data: eval-mixed48 ({ds.id}, artifact {data.id})" in text, text
    assert "tau by source" in text, text
    table = [ln.split("│")[1:5] for ln in text.splitlines() if "humaneval" in ln or "sharegpt" in ln]
    assert [[c.strip() for c in row] for row in table] == [
        ["humaneval", "24", "3.10", "1.00"], ["sharegpt", "24", "1.90", "1.00"]], text
