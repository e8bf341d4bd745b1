"""The dashboard acts, in a real headless Chromium against the real API: cancel,
retry, hold/release and priority on the job page and the run page, each after a
confirmation; failed datasets with their reason and a link to the failed job; a live log
tail; sparklines that stay in their row with 1-3 points; the real token file in the token
prompt; the queue's users table while a job runs; names people read for stage measures.
Screenshots go to tmp/artifacts/dashboard-actions/ (or $DRAFTYARD_TEST_ARTIFACTS)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.service.browser import ARTIFACTS, shoot

SHOTS = ARTIFACTS / "dashboard-actions"


def _shoot(d, name: str) -> Path:
    return shoot(d, "dashboard-actions", name, max_height=4000)


def _text(d, css: str) -> str:
    """The element's text; "" while it is missing or being re-rendered (callers poll)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        els = d.find_elements(By.CSS_SELECTOR, css)
        return els[0].text if els else ""
    except StaleElementReferenceException:
        return ""


def _click(d, label: str, answer: str | None = None) -> None:
    """Click the action button whose text starts with `label`, then accept its confirmation
    (or type `answer` into its prompt)."""
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(d, 30)
    _press(d, label)
    alert = wait.until(ec.alert_is_present())
    assert alert.text, "no confirmation text"
    if answer is not None:
        alert.send_keys(answer)
    alert.accept()


def _press(d, label: str) -> None:
    """Click the action button whose text starts with `label`; the page re-renders as it
    polls, so find and click in one go, again if the button went stale in between."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def press(d) -> bool:
        try:
            btn = next((b for b in d.find_elements(By.CSS_SELECTOR, "button.act")
                        if b.text.startswith(label)), None)
            if btn is None:
                return False
            btn.click()
            return True
        except StaleElementReferenceException:
            return False

    WebDriverWait(d, 30).until(press)


def _login(d, server, token) -> None:
    d.get(f"{server}/ui")
    d.execute_script("localStorage.setItem('draftyard_token', arguments[0])", token)


def _open(d, url: str) -> None:
    """Load `url` afresh (a hash change alone keeps the page, and the token it read)."""
    d.get(url)
    d.refresh()


def test_the_token_prompt_names_the_real_token_file(server, home, browser):
    d = browser
    d.get(f"{server}/ui")
    d.execute_script("localStorage.clear()")
    _open(d, f"{server}/ui#runs")
    wait_for(lambda: _text(d, "#token-file"), 20, 0.2, "the token prompt")
    assert _text(d, "#token-file") == f"cat {home / 'admin_token'}"
    _shoot(d, "token-prompt")


def test_job_page_cancel_retry_hold_release_priority(api, worker, server, browser):
    d = browser
    _login(d, server, api.token)
    job = api.submit(type="probe", gpus=64, params={"sleep_s": 0, "import_torch": False},
                     name="waits for 64 GPUs")  # no node has them: it waits, so it can be held
    try:
        _open(d, f"{server}/ui#job/{job['id']}")
        _click(d, "Hold")
        wait_for(lambda: api.job(job["id"])["held"], 20, 0.2, "the job held")
        wait_for(lambda: "Release" in _text(d, "#job-actions"), 20, 0.2, "a Release button")
        _shoot(d, "job-held")
        _click(d, "Release")
        wait_for(lambda: not api.job(job["id"])["held"], 20, 0.2, "the job released")
        _click(d, "Priority", answer="70")
        wait_for(lambda: api.job(job["id"])["priority"] == 70, 20, 0.2, "priority 70")
        _click(d, "Cancel")
        wait_for(lambda: api.job(job["id"])["status"] == "cancelled", 20, 0.2, "cancelled")
        wait_for(lambda: "Retry" in _text(d, "#job-actions"), 20, 0.2, "a Retry button")
        _shoot(d, "job-cancelled")
        _click(d, "Retry")
        wait_for(lambda: api.job(job["id"])["status"] in ("queued", "pending"), 20, 0.2,
                 "the job queued again")
    finally:
        api.post(f"/v1/jobs/{job['id']}/cancel")
    # a member sees no priority button (an admin's action) on their own job
    member = api.as_(api.post("/v1/users", {"name": "dash-member"}).json()["token"])
    mine = member.submit(type="probe", gpus=64, params={"sleep_s": 0, "import_torch": False})
    try:
        _login(d, server, member.token)
        _open(d, f"{server}/ui#job/{mine['id']}")
        wait_for(lambda: "Hold" in _text(d, "#job-actions"), 20, 0.2, "the member's buttons")
        assert "Priority" not in _text(d, "#job-actions")
        # dismissing the confirmation does nothing
        _press(d, "Cancel")
        d.switch_to.alert.dismiss()
        assert member.job(mine["id"])["status"] in ("queued", "pending")
    finally:
        member.post(f"/v1/jobs/{mine['id']}/cancel")


def test_run_page_cancel_hold_release_retry(api, worker, server, home, browser):
    from tests.tiny import tiny_model

    d = browser
    _login(d, server, api.token)
    t = api.post("/v1/targets", {"name": "dash-actions", "path": str(
        tiny_model(home / "models" / "tiny-dash-actions", arch="qwen3"))}).json()
    p = home / "data" / "dash-actions.jsonl"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                                  {"role": "assistant", "content": f"a {i}"}]})
                         + "\n" for i in range(40)))
    ds = api.post("/v1/datasets", {"name": "dash-actions", "path": str(p)}).json()
    wait_for(lambda: api.get(f"/v1/datasets/{ds['id']}").json()["status"] == "ready", 120, 0.3,
             "ingest")
    r = api.post("/v1/runs", {"name": "dash-actions", "target_id": t["id"],
                              "dataset_id": ds["id"], "drafter": {"type": "dflash"},
                              "mode": "online", "stages": {"prepare": {"seq_length": 256},
                                                           "extract": None,
                                                           "train": {"gpus": 64}}}, timeout=120)
    assert r.status_code == 201, r.text
    run = r.json()
    try:
        _open(d, f"{server}/ui#run/{run['id']}")
        _click(d, "Hold")
        waiting = lambda: [j for j in api.get(f"/v1/runs/{run['id']}").json()["jobs"]  # noqa: E731
                           if j["status"] in ("pending", "queued")]
        wait_for(lambda: waiting() and all(j["held"] for j in waiting()), 60, 0.2, "held")
        wait_for(lambda: "Release" in _text(d, "#run-actions"), 60, 0.2, "a Release button")
        _shoot(d, "run-held")
        _click(d, "Release")
        wait_for(lambda: not any(j["held"] for j in waiting()), 60, 0.2, "released")
        _click(d, "Cancel run")
        wait_for(lambda: api.get(f"/v1/runs/{run['id']}").json()["status"] == "cancelled", 60,
                 0.3, "the run cancelled")
        wait_for(lambda: "Retry run" in _text(d, "#run-actions"), 60, 0.2, "a Retry button")
        _shoot(d, "run-cancelled")
        _click(d, "Retry run")
        wait_for(lambda: api.get(f"/v1/runs/{run['id']}").json()["status"] != "cancelled", 60,
                 0.3, "the run retried")
    finally:
        api.post(f"/v1/runs/{run['id']}/cancel")


def test_datasets_log_tail_sparklines_queue_users_and_names(api, worker, server, home,
                                                            browser):
    from selenium.webdriver.common.by import By

    d = browser
    _login(d, server, api.token)
    # a failed dataset: its reason, and a link to the failed job
    p = home / "data" / "dash-odd.jsonl"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text('{"foo": 1}\n')
    ds = api.post("/v1/datasets", {"name": "dash-odd", "path": str(p)}).json()
    ds = wait_for(lambda: (x := api.get(f"/v1/datasets/{ds['id']}").json())["status"]
                  == "failed" and x, 120, 0.3, "the ingest to fail")
    _open(d, f"{server}/ui#datasets")
    wait_for(lambda: ds["id"] in _text(d, "main"), 20, 0.2, "the datasets page")
    row = next(r for r in d.find_elements(By.CSS_SELECTOR, "tr") if ds["id"] in r.text)
    assert "unknown format" in row.text and "--format" in row.text, row.text
    _shoot(d, "datasets-failed")
    row.find_element(By.CSS_SELECTOR, "a.joblink").click()
    wait_for(lambda: ds["job_id"] in _text(d, "main") and "ingest" in _text(d, "main"), 20,
             0.2, "the failed job's page")

    # a running job: the queue's users table, the live log tail, sparklines of 1-3 points
    job = api.submit(type="probe", name="dash-tail",
                     params={"sleep_s": 60, "steps": 40, "import_torch": False})
    short = api.submit(type="probe", name="dash-3-points",
                       params={"sleep_s": 0.2, "steps": 3, "import_torch": False})
    try:
        wait_for(lambda: api.job(job["id"])["status"] == "running", 60, 0.3, "running")
        _open(d, f"{server}/ui#queue")
        wait_for(lambda: "admin" in _text(d, "#queue-users"), 20, 0.2, "the users table")
        me = next(r for r in d.find_elements(By.CSS_SELECTOR, "#queue-users tr")
                  if r.text.startswith("admin"))
        assert int(me.find_elements(By.TAG_NAME, "td")[1].text) >= 1, me.text
        _shoot(d, "queue-users")
        _open(d, f"{server}/ui#job/{job['id']}")
        wait_for(lambda: "live" in _text(d, "main") and _text(d, "#log-tail"), 30, 0.3,
                 "the log tail")
        api.wait_job(short["id"], timeout=60)
        _open(d, f"{server}/ui#job/{short['id']}")
        wait_for(lambda: d.find_elements(By.CSS_SELECTOR, "svg.spark"), 20, 0.2, "a sparkline")
        for svg in d.find_elements(By.CSS_SELECTOR, "svg.spark"):
            box = d.execute_script(
                "const s = arguments[0], r = s.getBoundingClientRect(), "
                "row = s.closest('.spark-row').getBoundingClientRect(); "
                "const pts = [...s.querySelectorAll('circle')].map(c => c.getBoundingClientRect()); "
                "return {top: r.top, bottom: r.bottom, rowTop: row.top, rowBottom: row.bottom, "
                "dots: pts.map(p => [p.top, p.bottom])}", svg)
            assert box["rowTop"] <= box["top"] and box["bottom"] <= box["rowBottom"], box
            assert box["dots"] and all(box["top"] <= t and b <= box["bottom"]
                                       for t, b in box["dots"]), box
        _shoot(d, "job-sparklines")
    finally:
        api.post(f"/v1/jobs/{job['id']}/cancel")
    # names people read for stage measures, with the internal name only as a tooltip
    html = d.execute_script("return summary({tau_sim_baseline: 1.02, tau: 1.5, "
                            "evaluated_on: 'held out: 32 records never trained on'})")
    assert "untrained drafter&#39;s simulated tau" in html and ">tau_sim_baseline<" not in html


@pytest.fixture(autouse=True)
def _shots_dir():
    SHOTS.mkdir(parents=True, exist_ok=True)
