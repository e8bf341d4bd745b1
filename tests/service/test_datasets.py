"""Datasets over HTTP: upload and server-path ingest, limits, mix, delete; on both backends
(tests/conftest.py both_backends)."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.stages.conftest import shared_fixtures

pytestmark = pytest.mark.both_backends


@pytest.fixture(scope="module")
def fixtures():
    return shared_fixtures() / "datasets"


def _upload(api, path, name, fmt=None):
    with open(path, "rb") as fh:
        data = {"name": name, **({"format": fmt} if fmt else {})}
        return api.c.post("/v1/datasets", files={"file": (os.path.basename(path), fh)}, data=data)


def _ready(api, ds_id, timeout=90):
    from tests.conftest import wait_for

    return wait_for(lambda: (d := api.get(f"/v1/datasets/{ds_id}").json())["status"] != "ingesting"
                    and d, timeout, 0.2, f"{ds_id} ingest")


def test_upload_ingests_with_stats_and_artifact(api, worker, fixtures):
    r = _upload(api, fixtures / "sharegpt.jsonl", "sg")
    assert r.status_code == 201, r.text
    assert r.json()["status"] == "ingesting"
    d = _ready(api, r.json()["id"])
    assert d["status"] == "ready", d
    assert d["format"] == "sharegpt" and d["num_records"] == 4 and d["num_rejected"] == 0
    assert d["stats"]["with_tools"] == 1
    art = api.get(f"/v1/artifacts/{d['artifact_id']}").json()
    assert art["kind"] == "dataset" and any(f["path"] == "data.parquet" for f in art["files"])
    assert art["producer_job"] == d["job_id"]
    assert api.get(f"/v1/artifacts/{art['id']}/files/manifest.json").status_code == 200


def test_server_path_inside_roots_and_refusals(api, worker, fixtures, home):
    root = home / "data"
    shutil.copy(fixtures / "alpaca.jsonl", root / "alpaca.jsonl")
    d = api.post("/v1/datasets", {"name": "al", "path": str(root / "alpaca.jsonl")})
    assert d.status_code == 201, d.text
    assert _ready(api, d.json()["id"])["num_records"] == 4
    r = api.post("/v1/datasets", {"name": "x", "path": str(root / ".." / "api.log")})
    assert r.status_code == 403 and r.json()["error"]["code"] == "path_not_allowed"
    r = api.post("/v1/datasets", {"name": "x", "path": "/etc/passwd"})
    assert r.status_code == 403
    os.symlink("/etc/passwd", root / "sneaky.jsonl")
    r = api.post("/v1/datasets", {"name": "x", "path": str(root / "sneaky.jsonl")})
    assert r.status_code == 403, r.text
    r = api.post("/v1/datasets", {"name": "x", "path": str(root / "missing.jsonl")})
    assert r.status_code == 422


def test_bad_lines_are_reported_not_fatal(api, worker):
    import tempfile

    lines = [b'{"prompt": "hello"}', b'{"prompt": ', b'{"weird": 1}', b'\xff\xfe\x00binary',
             b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}',
             b'{"prompt": "two"}', b'{"prompt": "three"}']
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as fh:
        fh.write(b"\n".join(lines) + b"\n")
    d = _ready(api, _upload(api, fh.name, "messy").json()["id"])
    assert d["status"] == "ready" and d["num_records"] == 4 and d["num_rejected"] == 3
    assert sorted(x["line"] for x in d["rejected_sample"]) == [2, 3, 4]
    assert all(x["reason"] for x in d["rejected_sample"])
    # More than half rejected: the ingest fails with a summary, the dataset says why.
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as fh:
        fh.write(b"\n".join(lines[1:4] + lines[:1]) + b"\n")
    d = _ready(api, _upload(api, fh.name, "mostly-bad").json()["id"])
    assert d["status"] == "failed" and d["error"]["code"] == "too_many_rejects", d


@pytest.mark.postgres_only("starts a second API process on the session's database")
def test_upload_too_large_is_413_and_nothing_left(api, home, server):
    import subprocess
    import sys
    import tempfile

    # A second API process with a tiny upload cap, on the same database.
    from tests.conftest import Proc, free_port, wait_for
    import httpx

    port = free_port()
    p = Proc([sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory", "--port",
              str(port), "--log-level", "warning"], home / "api413.log",
             {"DRAFTYARD_MAX_UPLOAD_BYTES": "1000"})
    try:
        wait_for(lambda: _up(httpx, port), 60, 0.2, "api")
        with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as fh:
            fh.write(b'{"prompt": "x"}\n' * 500)
        c = api.as_(api.token)
        c.c.base_url = f"http://127.0.0.1:{port}"
        before = set(os.listdir(home / "uploads")) if (home / "uploads").exists() else set()
        r = _upload(c, fh.name, "big")
        assert r.status_code == 413, r.text
        after = set(os.listdir(home / "uploads")) if (home / "uploads").exists() else set()
        assert after == before
    finally:
        p.kill()
    _ = subprocess


def _up(httpx, port):
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_mix_over_http_and_delete_rules(api, worker, fixtures):
    a = _ready(api, _upload(api, fixtures / "alpaca.jsonl", "mx-a").json()["id"])
    b = _ready(api, _upload(api, fixtures / "alpaca.jsonl", "mx-b").json()["id"])
    c = _ready(api, _upload(api, fixtures / "openorca.jsonl", "mx-c").json()["id"])
    r = api.post("/v1/datasets/mix", {"name": "mixed", "seed": 1, "dedupe": True, "sources": [
        {"dataset_id": a["id"]}, {"dataset_id": b["id"]}, {"dataset_id": c["id"], "max_records": 1}]})
    assert r.status_code == 201, r.text
    m = _ready(api, r.json()["id"])
    assert m["status"] == "ready", m["error"]
    # b duplicates a exactly: dedupe drops all of b; c is capped at 1.
    assert m["num_records"] == 4 + 0 + 1
    art = api.get(f"/v1/artifacts/{m['artifact_id']}").json()
    srcs = {s["dataset_id"]: s for s in art["meta"]["sources"]}
    assert srcs[b["id"]]["duplicates_dropped"] == 4 and srcs[c["id"]]["taken"] == 1
    assert set(art["inputs"]) == {a["artifact_id"], b["artifact_id"], c["artifact_id"]}
    assert api.delete(f"/v1/datasets/{b['id']}").status_code == 204
    assert api.get(f"/v1/datasets/{b['id']}").status_code == 404
    r = api.post("/v1/datasets/mix", {"name": "m2", "sources": [{"dataset_id": "ds_nope"}]})
    assert r.status_code == 422
