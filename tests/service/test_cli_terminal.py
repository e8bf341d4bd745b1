"""The CLI as a user sees it in a terminal of 80 columns (and 60): run in a pseudo-terminal
with COLUMNS set, against the real API and worker. A run body for prompt-only data, a plan's
time estimates, cancelling a run by name, listings that stay readable when narrow."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import uuid
from dataclasses import dataclass

import pytest

from tests.conftest import REPO, wait_for
from tests.tiny import counting_records, ingested, tiny_target, write_jsonl

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)")
BOX = "│┃┏┓┗┛┡┩┠┨┣┫┳┻╇╋━─┌┐└┘├┤┬┴┼╭╮╰╯"


@dataclass
class Screen:
    rc: int
    text: str  # what the terminal showed (stdout), colours removed
    err: str   # stderr, apart


def tty(api, *args, columns: int = 80, cwd=REPO, timeout: float = 300) -> Screen:
    """`draftyard ARGS` with its stdout on a pseudo-terminal `columns` wide (COLUMNS too)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {**os.environ, "DRAFTYARD_URL": api.url, "DRAFTYARD_TOKEN": api.token,
           "COLUMNS": str(columns), "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    p = subprocess.Popen([sys.executable, "-m", "app.cli.main", *args], cwd=cwd, env=env,
                         stdin=slave, stdout=slave, stderr=subprocess.PIPE)
    os.close(slave)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], timeout)
            assert ready, f"draftyard {' '.join(args)}: no output for {timeout} s"
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
        rc = p.wait(timeout=timeout)
    text = ANSI.sub("", out.decode("utf-8", "replace")).replace("\r\n", "\n")
    screen = Screen(rc, text, p.stderr.read().decode() if p.stderr else "")
    print(f"$ COLUMNS={columns} draftyard {' '.join(args)}\n{screen.text}{screen.err}")
    return screen


def fragments(text: str) -> list[str]:
    """Lines that show a word broken one character per line: every cell one character,
    or a lone letter in a cell."""
    bad = []
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(f"[{BOX}]", line)]
        cells = [c for c in cells if c]
        if not cells:
            continue
        if (len(cells) > 1 and all(len(c) == 1 for c in cells)) or \
                any(len(c) == 1 and c.isalpha() for c in cells):
            bad.append(line)
    return bad


@pytest.fixture(scope="module")
def target(api, home):
    return tiny_target(api, home, "tty-target")


@pytest.fixture(scope="module")
def prompts(api, home):
    """A dataset of prompts only (no assistant answer), as ShareGPT or HumanEval prompts are."""
    recs = [{"messages": [{"role": "user", "content": f"count to {i}"}]} for i in range(30)]
    return ingested(api, write_jsonl(home / "data" / "tty-prompts.jsonl", recs), "tty-prompts")


@pytest.fixture(scope="module")
def chats(api, home):
    return ingested(api, write_jsonl(home / "data" / "tty-chat.jsonl", counting_records(40)),
                    "tty-chat")


def test_init_run_sets_generate_for_prompt_only_data_and_the_plan_says_what_to_add(
        api, worker, target, prompts, chats, tmp_path):
    assert prompts["stats"]["user_only"] == 30, prompts
    out = tmp_path / "run.json"
    s = tty(api, "init-run", "tty-target", "tty-prompts", "-o", str(out))
    assert s.rc == 0, s
    body = json.loads(out.read_text())
    assert body["stages"]["generate"] == {"backend": "auto"}, body
    # why, on stderr: the count, and what the stage is for
    assert "stages.generate is set: 30 of 30 records" in s.err and "prompt-only" in s.err, s
    # the tiny target: 256 positions, 16 answer tokens
    body["stages"]["prepare"]["seq_length"] = 256
    body["stages"]["generate"]["max_tokens"] = 16
    body["stages"]["train"] = {"epochs": 1, "max_steps": 2, "seq_length": 256}
    out.write_text(json.dumps(body))
    plan = tty(api, "plan", str(out))
    assert plan.rc == 0, plan
    assert "records_render: all" in plan.text
    # the time estimates, per stage and in total, with where the rates came from
    assert "time estimates for H100/H200-class" in plan.text, plan.text
    assert "rates: the defaults (the server's DRAFTYARD_PLAN_RATES" in plan.text
    for stage in ("generate", "prepare", "train", "evaluate"):
        assert re.search(rf"^  {stage} +(\d+ GPUs?|CPU) +(<?[\d.,]+) GPU-h +\S+ \S+ wall$",
                         plan.text, re.M), (stage, plan.text)
    assert re.search(r"^  total +<?[\d.,]+ GPU-h .* wall, .* written$", plan.text, re.M)
    assert not fragments(plan.text), fragments(plan.text)
    # --json: the API's answer as it came
    raw = tty(api, "plan", str(out), "--json", columns=80)
    ans = json.loads(raw.text)
    assert raw.rc == 0 and ans["ok"] and ans["time_estimates"]["total_gpu_hours"] >= 0, raw
    assert {s["stage"] for s in ans["time_estimates"]["stages"]} >= {"generate", "train"}

    # without the stage the plan fails, and its advice is the field to add
    body["stages"]["generate"] = None
    out.write_text(json.dumps(body))
    plan = tty(api, "plan", str(out))
    assert plan.rc == 1 and "needs_generate" in plan.text, plan
    # a check, a record or a warning wrapped at 80 columns goes on under its text, never at
    # the margin: every line is the plan's head, the estimates' head, or indented
    assert all(ln.startswith(("plan", "time estimates", "  ")) or not ln.strip()
               for ln in plan.text.splitlines()), plan.text
    flat = " ".join(plan.text.split())
    assert "add stages.generate" in flat and "raise stages.prepare.max_reject_share" not in flat

    # a dataset with answers keeps them: no generate stage, nothing said
    s = tty(api, "init-run", "tty-target", "tty-chat", "-o", str(tmp_path / "chat.json"))
    assert s.rc == 0 and "stages.generate" not in s.err, s
    assert json.loads((tmp_path / "chat.json").read_text())["stages"]["generate"] is None


def test_runs_cancel_by_name_or_id(api, worker, target, chats):
    name = f"tty-cancel-{uuid.uuid4().hex[:6]}"
    body = {"name": name, "target_id": target["id"], "dataset_id": chats["id"],
            "drafter": {"type": "dflash", "num_layers": 1, "draft_vocab_size": 256},
            "mode": "online",
            "stages": {"prepare": {"seq_length": 256}, "extract": None,
                       "train": {"epochs": 50, "seq_length": 256}, "evaluate": None}}
    r = api.post("/v1/runs", body, timeout=300)
    assert r.status_code == 201, r.text
    run = r.json()
    s = tty(api, "runs", "cancel", name)
    assert s.rc == 0, s
    assert f"run {run['id']} ({name}): " in s.text, s.text
    # a running stage stops within moments (SIGTERM to its process group); then the run ends
    final = wait_for(lambda: (x := api.get(f"/v1/runs/{run['id']}").json())["status"]
                     in ("cancelled", "failed", "succeeded") and x, 60, 0.3, "the run's end")
    assert final["status"] == "cancelled", final
    for j in final["jobs"]:
        assert j["id"] in s.text
    # by id, again: nothing left to cancel, not an error
    assert tty(api, "runs", "cancel", run["id"]).rc == 0
    s = tty(api, "runs", "cancel", "no-such-run")
    assert s.rc == 1 and "no run has the id or name 'no-such-run'" in s.text, s


@pytest.mark.parametrize("columns", [80, 60])
def test_narrow_listings_become_lists_never_one_character_per_line(api, worker, target, chats,
                                                                     columns):
    job = api.post("/v1/jobs", {"type": "probe", "params": {"sleep_s": 0,
                                                            "import_torch": False},
                                "name": "a job name long enough to want the whole row"}).json()
    runs = api.get("/v1/runs").json()["data"]
    for args, want in ((("targets",), [target["id"], target["name"], target["path"],
                                       target["architecture"]]),
                       (("datasets",), [chats["id"], "tty-chat"]),
                       (("jobs",), [job["id"]]),
                       (("runs",), [r["id"] for r in runs])):
        s = tty(api, *args, columns=columns)
        assert s.rc == 0, s
        assert not fragments(s.text), (args, fragments(s.text), s.text)
        for w in want:  # whole, on one line
            assert any(w in line for line in s.text.splitlines()), (args, w, s.text)
        assert all(len(line) <= columns for line in s.text.splitlines()), s.text


def test_runs_show_at_80_columns_keeps_every_lineage_id_whole(api, reported_run):
    s = tty(api.as_(reported_run["token"]), "runs", "show", reported_run["run"]["id"])
    assert s.rc == 0, s
    assert not fragments(s.text), fragments(s.text)
    rep = api.get(f"/v1/runs/{reported_run['run']['id']}/report").json()
    assert rep["lineage"]
    for a in rep["lineage"]:
        for x in [a["id"], *a["inputs"]]:
            assert any(x in line for line in s.text.splitlines()), (x, s.text)
