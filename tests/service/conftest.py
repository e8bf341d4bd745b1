"""Fixtures of the service tests: the in-process ones (on the rolled-back `db` session), and a
finished run (prepare -> extract -> train -> evaluate) on a tiny target, owned by a member,
set up through the Python client and submitted with `draftyard run --follow` (the CLI's whole
run), shared by the client, CLI and run-report tests so that its stages run once per session."""

from __future__ import annotations

import json
import uuid

import pytest

from app.core.auth import Principal
from app.core.ids import new_id
from app.models import User
from tests.service.browser import browser  # noqa: F401  headless Chromium, for the dashboard tests
from tests.tiny import counting_records, tiny_model, write_jsonl


@pytest.fixture
def user(db) -> Principal:
    """A member, as the services see the caller."""
    u = User(id=new_id("usr"), name=f"u-{uuid.uuid4().hex[:8]}", role="member")
    db.add(u)
    db.flush()
    return Principal(u.id, u.name, u.role)


@pytest.fixture(scope="session")
def reported_run(pg_api, pg_worker, pg_home, tmp_path_factory) -> dict:
    from draftyard import Client

    api, home = pg_api, pg_home  # a session's run: on the session's PostgreSQL deployment
    admin = Client(api.url, api.token)
    name = f"ana-{uuid.uuid4().hex[:4]}"
    user = admin.create_user(name, "member")
    c = Client(api.url, user["token"], timeout=180)
    d = tiny_model(home / "models" / "tiny-report", arch="qwen3")
    target = c.create_target("tiny-report", str(d))
    f = tmp_path_factory.mktemp("report") / "chat.jsonl"
    write_jsonl(f, counting_records(16))
    seen: list[tuple[int, int | None]] = []
    ds = c.wait_dataset(c.upload_dataset(f, "report-chat",
                                         progress=lambda n, t: seen.append((n, t)))["id"], 120)
    assert ds["status"] == "ready", ds
    body = {"name": "report-run", "target_id": target["id"], "dataset_id": ds["id"],
            "drafter": {"type": "dflash", "num_layers": 1, "block_size": 4,
                        "draft_vocab_size": 256},
            "chat_template_kwargs": {"enable_thinking": False},
            # No generate stage: it would add a minute and nothing to the report.
            "stages": {"generate": None,
                       "prepare": {"seq_length": 256},
                       "extract": {"dtype": "float32", "backend": "hf"},
                       "train": {"epochs": 4, "max_steps": 12, "seq_length": 256, "log_every": 1,
                                 "drafter": {"num_anchors": 16}},
                       "evaluate": {"num_prompts": 2, "max_new_tokens": 8}}}
    # Submitted as a user would from the terminal; the client then waits on it.
    from tests.service.test_cli import cli

    body_file = f.with_name("run.json")
    body_file.write_text(json.dumps(body))
    p = cli(api.as_(user["token"]), "run", str(body_file), "--follow", timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    run_id = p.stdout.split("submitted run ")[1].split(":")[0].strip()
    run = c.wait_run(run_id, timeout=600)
    assert run["status"] == "succeeded", run["stages"]
    return {"run": run, "user": user, "target": target, "dataset": ds, "upload_progress": seen,
            "file": f, "token": user["token"], "cli_follow": p.stdout, "body": body}
