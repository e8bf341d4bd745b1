"""Disk reservations on a real small filesystem: the deployment's home is a tmpfs.
Two extracts that each fit alone but not together: the first is placed with its bytes
reserved, the second waits with the reason ("needs ... on ..., ... free after reservations")
instead of starting and failing with disk_full; when space is freed (the first's artifact
deleted) it runs. Neither fails. Needs root (mount)."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tests.faults.harness import TERMINAL, FaultStack
from tests.faults.test_disk_full import small_fs  # noqa: F401 (fixture)
from tests.stages.conftest import shared_fixtures


def _ok(r, code=(200, 201)):
    assert r.status_code in code, r.text
    return r.json()


@pytest.mark.slow  # ~60 s on 2 cores: a deployment of its own, a prepare and two extracts
def test_two_extracts_that_do_not_fit_together_one_waits_neither_fails(small_fs):  # noqa: F811
    from tests.tiny import tiny_model

    outside = Path(tempfile.mkdtemp(prefix="draftyard-reserve-"))
    (outside / "data").mkdir()
    target_dir = tiny_model(outside / "models" / "tiny", arch="qwen3")
    src = outside / "data" / "chat.jsonl"
    shutil.copy(shared_fixtures() / "datasets" / "sharegpt.jsonl", src)
    (small_fs / "home").mkdir()
    fs = FaultStack(stale_s=6, home=small_fs / "home", settings={
        "DRAFTYARD_DATA_ROOTS": str(outside / "data"),
        "DRAFTYARD_MODEL_ROOTS": str(outside / "models")})
    try:
        fs.up()
        c = fs.client()
        tgt = _ok(c.post("/v1/targets", json={"name": "tiny", "path": str(target_dir)}))
        ds = _ok(c.post("/v1/datasets", json={"name": "chat", "path": str(src)}))
        fs.wait(lambda: c.get(f"/v1/datasets/{ds['id']}").json()["status"] == "ready", 120,
                "the ingest")
        prep = _ok(c.post("/v1/jobs", json={"type": "prepare", "inputs": {
            "dataset": ds["id"], "target": tgt["id"]}, "params": {"seq_length": 256}}))
        prep = fs.wait(lambda: (x := fs.job(prep["id"]))["status"] in TERMINAL and x, 120,
                       "the prepare")
        assert prep["status"] == "succeeded", prep
        body = {"type": "extract", "force": True,
                "inputs": {"tokenized": {"job": prep["id"]}, "target": tgt["id"]},
                "params": {"dtype": "float32", "backend": "hf", "disk_margin_bytes": 0}}

        # Nearly fill the volume: the first extract cannot be placed, and says why.
        ballast = small_fs / "ballast"
        with open(ballast, "wb") as fh:
            fh.write(b"\0" * (shutil.disk_usage(small_fs).free - 200_000))
        a = _ok(c.post("/v1/jobs", json=body))
        a = fs.wait(lambda: (x := fs.job(a["id"]))["status"] != "queued" or (
            "free after reservations" in (x["pending_reason"] or "")) and x, 30,
            "the first extract to wait for disk")
        assert a["status"] == "queued", json.dumps(a)[:3000]
        with fs.stack.engine().connect() as conn:
            from sqlalchemy import text

            need = conn.execute(text("SELECT disk_bytes FROM jobs WHERE id = :j"),
                                {"j": a["id"]}).scalar()
        assert need and need > 100_000, need
        print("the first extract, volume nearly full:", a["pending_reason"])

        # Room for one and a half: A is placed, B (submitted now) waits with the reason.
        free = shutil.disk_usage(small_fs).free
        with open(ballast, "r+b") as fh:
            fh.truncate(ballast.stat().st_size - (int(1.5 * need) - free))
        b = _ok(c.post("/v1/jobs", json=body))
        fs.wait(lambda: fs.job(a["id"])["status"] in ("dispatched", "running", "succeeded"), 30,
                "the first extract to be placed")
        b_wait = fs.wait(lambda: (x := fs.job(b["id"]))["pending_reason"] and
                         "free after reservations" in x["pending_reason"] and x, 30,
                         "the second extract to wait for disk")
        reason = b_wait["pending_reason"]
        print("the second extract:", reason)
        assert reason.startswith("needs ") and str(small_fs / "home" / "jobs") in reason
        a = fs.wait(lambda: (x := fs.job(a["id"]))["status"] in TERMINAL and x, 180,
                    "the first extract")
        assert a["status"] == "succeeded", a
        time.sleep(2)  # passes after A's end: B still does not fit (A's output is there)
        b_now = fs.job(b["id"])
        assert b_now["status"] == "queued" and "free after reservations" in \
            b_now["pending_reason"], b_now

        # The team frees space: A's hidden states are deleted; B runs and succeeds.
        _ok(c.delete(f"/v1/artifacts/{a['outputs'][0]}"))
        fs.submit(0, 0.1)  # a scheduling pass now rather than at the next tick
        b = fs.wait(lambda: (x := fs.job(b["id"]))["status"] in TERMINAL and x, 180,
                    "the second extract")
        assert b["status"] == "succeeded", json.dumps(b)[:2000]
        for j in (a, b):  # neither ever failed an attempt
            assert j["attempt"] == 1 and j["error"] is None, j
        u = c.get("/v1/storage").json()
        assert u["deleted"]["bytes_freed"] > 0
    finally:
        fs.close()
        shutil.rmtree(outside, ignore_errors=True)
