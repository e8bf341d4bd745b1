"""The CLI on a team's first day: a run body written from names, tables whose ids
can be copied at 80 columns, and failures that are one line naming the cause."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.tiny import counting_records, ingested, tiny_target, write_jsonl


def cli(api, *args, columns: int = 80, token: str | None = None, home=None,
        cwd=REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "DRAFTYARD_URL": api.url, "COLUMNS": str(columns), "NO_COLOR": "1"}
    env.pop("DRAFTYARD_TOKEN", None)
    if token is not None:
        env["DRAFTYARD_TOKEN"] = token
    if home is not None:
        env["DRAFTYARD_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "app.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def named(api, home):
    t = tiny_target(api, home, "cli-fd-target")
    p = write_jsonl(home / "data" / "cli-fd.jsonl", counting_records(40))
    return t, ingested(api, p, "cli-fd-data")


def test_init_run_writes_a_body_from_names_that_plans(api, worker, named, tmp_path):
    target, ds = named
    out = tmp_path / "run.json"
    r = cli(api, "init-run", "cli-fd-target", "cli-fd-data", "-o", str(out), token=api.token)
    assert r.returncode == 0, r.stdout + r.stderr
    body = json.loads(out.read_text())
    assert body["target_id"] == target["id"] and body["dataset_id"] == ds["id"]
    assert body["evaluation"] == "held_out" and body["drafter"] == {"type": "dflash"}
    assert f"draftyard plan {out}" in " ".join(r.stdout.split())
    body["stages"]["prepare"]["seq_length"] = 256  # the tiny target's positions
    out.write_text(json.dumps(body))
    r = cli(api, "plan", str(out), token=api.token)
    assert "plan" in r.stdout and "Traceback" not in r.stderr, r.stdout + r.stderr
    # a second time: the file is not overwritten without --force
    r = cli(api, "init-run", "cli-fd-target", "cli-fd-data", "-o", str(out), token=api.token)
    assert r.returncode == 2 and "exists already" in r.stdout
    r = cli(api, "init-run", "no-such", "cli-fd-data", "-o", str(tmp_path / "x.json"),
            token=api.token)
    assert r.returncode == 1 and "no target has the id or name 'no-such'" in r.stdout, r.stdout


def test_tables_never_cut_ids_at_80_columns(api, worker, named):
    job = api.submit(type="probe", params={"sleep_s": 0, "import_torch": False},
                     name="a rather long job name that would take the room of the id column")
    for args, want in ((("jobs",), job["id"]), (("targets",), named[0]["id"]),
                       (("datasets",), named[1]["id"])):
        r = cli(api, *args, token=api.token)
        assert r.returncode == 0, r.stdout + r.stderr
        assert want in r.stdout, r.stdout  # whole, on one line
        assert "…" not in "".join(line for line in r.stdout.splitlines() if want in line)


def _one_line(r) -> str:
    out = (r.stdout + r.stderr).strip()
    assert "Traceback" not in out and len(out.splitlines()) == 1, out
    return out


def test_every_failure_is_one_line_naming_the_cause(api, worker, tmp_path):
    # a chat template file that is not there: the file, not a 32-line traceback
    r = cli(api, "targets", "add", "x", "/m", "--chat-template", "missing.jinja",
            token=api.token, columns=60)
    assert r.returncode == 2
    assert _one_line(r) == "error --chat-template missing.jinja: no such file"
    # an unknown token: where the token comes from, with the real DRAFTYARD_HOME
    home = tmp_path / "dyhome"
    r = cli(api, "jobs", token="not-a-token", home=home, columns=60)
    line = _one_line(r)
    assert r.returncode == 1 and "set DRAFTYARD_TOKEN" in line
    assert str(home / "admin_token") in line, line
    # anything else: its type and message, the traceback only with --debug
    r = cli(api, "plan", str(tmp_path), token=api.token)
    line = _one_line(r)
    assert r.returncode == 1 and "IsADirectoryError" in line and "--debug" in line, line
    r = cli(api, "--debug", "plan", str(tmp_path), token=api.token)
    assert "Traceback" in r.stderr and r.returncode == 1
