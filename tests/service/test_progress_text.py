"""What a progress bar says, in the CLI (app/cli/view.py progress_info) and on the dashboard
(app/dashboard/app.js `progress`, run in node), from the job's `progress` as the API gives
it: a train of one-minute steps shows seconds per step and an ETA after its first step, and a
stage with phases names the phase and its place."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from app.cli.view import progress_info
from tests.conftest import REPO

# After step 1 of 42, one step a minute (workers/supervisor.py _Rate from the reports of
# steps 0 and 1), and evaluate in its third phase.
SLOW = {"stage": "train", "done": 1, "total": 42, "unit": "steps", "rate": 1 / 61,
        "eta_s": 41 * 61}
PHASE = {"stage": "evaluate: with the drafter (3/6)", "done": 5, "total": 32,
         "unit": "prompts", "rate": 0.5, "eta_s": 54, "phase": "with the drafter",
         "phase_index": 3, "phases": 6}


def test_cli_progress_text():
    assert progress_info("running", SLOW) == "running 1/42 steps 61 s each ETA 41m41s"
    assert progress_info("running", PHASE) == \
        "running with the drafter (3/6) 5/32 prompts 0.5/s ETA 54s"
    assert progress_info("succeeded", {**PHASE, "done": 32}).endswith("32/32 prompts 0.5/s")


def _dashboard_fn() -> str:
    src = (REPO / "app" / "dashboard" / "app.js").read_text()
    esc = re.search(r"^const esc = .*$", src, re.M).group(0)
    dur = re.search(r"^function dur\(s\) \{.*?^\}", src, re.M | re.S).group(0)
    prog = re.search(r"^function progress\(p, status\) \{.*?^\}", src, re.M | re.S).group(0)
    return "\n".join((esc, dur, prog))


@pytest.mark.skipif(shutil.which("node") is None, reason="node is needed to run app.js")
def test_dashboard_progress_text():
    script = _dashboard_fn() + f"""
const strip = h => h.replace(/<[^>]+>/g, " ").replace(/\\s+/g, " ").trim();
console.log(JSON.stringify([strip(progress({json.dumps(SLOW)}, "running")),
                            strip(progress({json.dumps(PHASE)}, "running"))]));"""
    out = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    slow, phase = json.loads(out.stdout)
    assert slow == "train: 1/42 steps · 61 s each · ETA 41m41s", slow
    assert phase == "evaluate: with the drafter (3/6): 5/32 prompts · 0.50 prompts/s · ETA 54s", \
        phase
