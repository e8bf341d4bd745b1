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


def test_progress_bars_at_80_columns_keep_name_bar_and_percent_whole():
    """`follow_jobs`'s lines at 80 columns: the stage names whole, a bar, the percent, and the
    info cut with an ellipsis where the line ends (the name used to be padded to 28 and the
    bar squeezed to nothing)."""
    import io

    from rich.console import Console
    from rich.progress import Progress

    from app.cli.view import progress_columns

    names = ["generate", "prepare", "extract", "train", "evaluate"]
    long = dict(PHASE, phase="tau_sim baseline", phase_index=7, phases=7)
    for width in (80, 60):
        con = Console(width=width, file=io.StringIO(), force_terminal=False)
        with Progress(*progress_columns(names), console=con, expand=True) as prog:
            for n in names:
                prog.update(prog.add_task(n, total=32, info=progress_info("running", long)),
                            completed=16)
        lines = [ln.rstrip() for ln in con.file.getvalue().splitlines() if ln.strip()]
        assert len(lines) == len(names), lines
        for n, line in zip(names, lines, strict=True):
            assert line.startswith(n + " ") and len(line) <= width, line
            assert re.search(r"━{4,}.* 50% running", line), line
            assert line.endswith("…"), line  # cut, not wrapped onto a second line
