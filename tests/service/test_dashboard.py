"""The dashboard (GET /ui): served without a token, and its script, run by node against the
real API with a real token, renders every view, a finished job's progress (done/total) and
a running job's rate and ETA; on both backends (tests/conftest.py both_backends)."""

from __future__ import annotations

import json
import shutil
import subprocess

import httpx
import pytest

from tests.conftest import wait_for

pytestmark = pytest.mark.both_backends

HARNESS = r"""
const fs = require("fs");
const [, , scriptPath, base, token, doneId, runningId] = process.argv;
const script = fs.readFileSync(scriptPath, "utf8");
const els = {};
globalThis.document = {getElementById: id => (els[id] ??= {innerHTML: "", textContent: "", value: ""}),
                       addEventListener: () => {}};
globalThis.localStorage = {getItem: () => token, setItem: () => {}};
globalThis.location = {hash: "", host: "test"};
globalThis.window = {addEventListener: () => {}};
globalThis.setInterval = () => 0;
globalThis.clearInterval = () => {};
const realFetch = fetch;
globalThis.fetch = (path, opts) => realFetch(base + path, opts);
eval(script + `;(async () => {
  const out = {};
  for (const v of VIEWS) out[v] = await RENDER[v]();
  out.job_done = await RENDER.job(${JSON.stringify(doneId)});
  out.job_running = await RENDER.job(${JSON.stringify(runningId)});
  console.log(JSON.stringify(out));
})().catch(e => { console.error(String(e && e.stack || e)); process.exit(1); });`);
"""


def test_page_is_served_without_a_token(server):
    r = httpx.get(f"{server}/ui")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "<title>draftyard</title>" in r.text
    # A CSP with no inline script, and no framing by other sites
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp.split("style-src-attr")[0]
    assert "frame-ancestors 'none'" in csp and r.headers["x-frame-options"] == "DENY"
    assert "<script>" not in r.text and "<style>" not in r.text and "onclick=" not in r.text
    js = httpx.get(f"{server}/ui/app.js")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    assert "/v1/runs" in js.text and "onclick=\"" not in js.text
    assert httpx.get(f"{server}/ui/app.css").headers["content-type"].startswith("text/css")
    assert httpx.get(f"{server}/ui/../main.py").status_code == 404
    r = httpx.get(f"{server}/", follow_redirects=False)
    assert r.status_code in (302, 307) and r.headers["location"] == "/ui"


@pytest.mark.skipif(not shutil.which("node"), reason="node is needed to run the page's script")
def test_every_view_renders_against_the_real_api(api, worker, worker_node, server, tmp_path):
    done = api.submit(type="probe", name="dash-done",
                      params={"sleep_s": 0.3, "steps": 3, "import_torch": False})
    running = api.submit(type="probe", name="dash-running",
                         params={"sleep_s": 40, "steps": 400, "import_torch": False})
    d = api.wait_job(done["id"], timeout=60)
    assert d["status"] == "succeeded" and d["progress"]["total"] == 3
    wait_for(lambda: (p := api.job(running["id"])["progress"]) and p.get("rate") and
             p.get("eta_s") is not None and 0 < p["done"] < p["total"], 60, 0.3,
             "the running probe to report a rate and an ETA")
    page = tmp_path / "app.js"
    page.write_text(httpx.get(f"{server}/ui/app.js").text + "\n" +
                    httpx.get(f"{server}/ui/actions.js").text)
    (tmp_path / "harness.js").write_text(HARNESS)
    try:
        out = subprocess.run(["node", str(tmp_path / "harness.js"), str(page), server, api.token,
                              done["id"], running["id"]], capture_output=True, text=True,
                             timeout=60)
    finally:
        api.post(f"/v1/jobs/{running['id']}/cancel")
    assert out.returncode == 0, out.stderr[-3000:]
    views = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(views) == {"runs", "jobs", "queue", "nodes", "datasets", "job_done", "job_running"}
    assert done["id"] in views["jobs"] and running["id"] in views["jobs"]
    assert running["id"] in views["queue"] and worker_node in views["nodes"]
    assert "3/3 steps" in views["job_done"] and "succeeded" in views["job_done"]
    assert "steps/s" in views["job_running"] and "ETA " in views["job_running"]
    assert all("HTTP " not in v and "class=\"err\"" not in v for v in views.values())
