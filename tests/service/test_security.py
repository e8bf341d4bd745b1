"""A member reads only what the server was told to expose, one
request cannot break listings for everyone, and bad input is never a 500."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid

import httpx
import pytest

from tests.conftest import REPO, wait_for
from tests.service.test_api_errors import _err


def _raw(c: httpx.Client, path: str, text: str, **headers) -> httpx.Response:
    return c.post(path, content=text.encode(), headers={"content-type": "application/json",
                                                          **headers})


# ---- 1: every path through one check -------------------------------------------------------

def test_ingest_job_cannot_name_a_file_outside_the_data_roots(member, api, home, tmp_path):
    data = home / "data"
    (data / "ok.jsonl").write_text('{"prompt": "hi"}\n')
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"prompt": "not yours"}\n' * 7)
    link = data / f"link-{uuid.uuid4().hex[:6]}.jsonl"
    link.symlink_to(secret)
    msgs = []
    for p in (str(secret), str(tmp_path / "missing.jsonl"), str(link),
              "../" * 20 + str(secret).lstrip("/"), "../" * 20 + "etc/passwd"):
        e = _err(member.post("/v1/jobs", {"type": "ingest", "inputs": {"source": {"path": p}}}),
                 403, "path_not_allowed")
        assert e["param"] == "inputs.source.path"
        rest = e["message"].replace(p, "")
        assert str(data) not in rest and str(home) not in rest, e
        msgs.append(e["message"].replace(p, "<p>"))
    # the same words whether the file exists or not, and nothing about its lines
    assert len(set(msgs)) == 1, msgs
    # a file inside the roots is accepted, stored as its real path (which admins read; a
    # member reads it under its root's label)
    job = member.submit(type="ingest", inputs={"source": {"path": "ok.jsonl"}})
    assert job["inputs"]["source"]["path"] == "data:ok.jsonl"
    assert api.job(job["id"])["inputs"]["source"]["path"] == str((data / "ok.jsonl").resolve())
    member.post(f"/v1/jobs/{job['id']}/cancel")
    # typed: a source is {"path", "name"?}, nothing else
    e = _err(member.post("/v1/jobs", {"type": "ingest",
                                      "inputs": {"source": {"path": "ok.jsonl", "x": 1}}}), 422)
    assert e["param"] == "inputs.source.x"


def test_other_routes_do_not_show_roots_or_existence(member, home, tmp_path):
    for route, body in (("/v1/datasets", {"name": "x", "path": "/etc/passwd"}),
                        ("/v1/datasets", {"name": "x", "path": str(tmp_path / "nope")}),
                        ("/v1/targets", {"name": "x", "path": "/etc"}),
                        ("/v1/targets", {"name": "x", "path": str(home / "models"),
                                         "tokenizer_path": "/usr/lib"})):
        e = _err(member.post(route, body), 403, "path_not_allowed")
        assert str(home) not in e["message"], e
    # inside the roots, a refusal names the path as the client wrote it, not the real one
    (home / "models" / "empty").mkdir(exist_ok=True)
    e = _err(member.post("/v1/targets", {"name": "x", "path": "empty"}), 422, "not_a_model")
    assert str(home) not in e["message"] and "empty" in e["message"], e


def test_the_stage_checks_the_roots_again(tmp_path):
    """Defence in depth: a spec whose path slipped past the API (or was edited on disk) is
    refused by the stage runner before the stage opens anything."""
    (tmp_path / "data").mkdir()
    outside = tmp_path / "outside.jsonl"
    outside.write_text('{"prompt": "hi"}\n')
    spec = {"type": "ingest", "inputs": {"source": {"path": str(outside)}}, "params": {},
            "out_dir": str(tmp_path / "out"), "work_dir": str(tmp_path / "work"),
            "events_path": str(tmp_path / "events.jsonl"),
            "roots": {"data": [str(tmp_path / "data")], "model": [], "artifacts": []}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    p = subprocess.run([sys.executable, "-m", "workers.stages", "ingest", "--spec",
                        str(tmp_path / "spec.json")], cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert events[-1]["kind"] == "error" and events[-1]["data"]["code"] == "path_not_allowed"
    assert not (tmp_path / "out" / "dataset").exists()


# ---- 3: bounded free-form JSON; listings survive stored values ----------------------------

def _deep(n: int) -> dict:
    v: dict = {"leaf": 1}
    for _ in range(n):
        v = {"a": v}
    return v


def test_deep_or_huge_free_form_json_is_400_naming_the_field(api):
    deep = _deep(250)
    e = _err(api.post("/v1/jobs", {"type": "probe", "inputs": {"x": deep}}), 400, "json_too_deep")
    assert e["param"] == "inputs"
    e = _err(api.post("/v1/jobs", {"type": "probe", "params": {"note": "x" * 300_000}}), 400,
             "json_too_large")
    assert e["param"] == "params"
    e = _err(api.post("/v1/targets", {"name": "t", "path": "m", "chat_template_kwargs": deep}),
             400, "json_too_deep")
    assert e["param"] == "chat_template_kwargs"
    e = _err(api.post("/v1/runs", {"name": "r", "target_id": "tgt_x", "dataset_id": "ds_x",
                                   "drafter": {"type": "dflash"},
                                   "stages": {"train": {"x": deep}}}), 400, "json_too_deep")
    assert e["param"] == "stages.train"
    e = _err(api.post("/v1/runs", {"name": "r", "target_id": "tgt_x", "dataset_id": "ds_x",
                                   "drafter": {"type": "dflash", "extra": deep}}), 400)
    assert e["param"] == "drafter"
    assert api.get("/v1/jobs").status_code == 200 and api.get("/v1/targets").status_code == 200


def test_listings_render_stored_values_orjson_refuses(api):
    """Rows stored before the bounds existed (or written by hand) must not 500 a listing."""
    from sqlalchemy import update

    from app.core.db import unit_of_work
    from app.models import Job

    job = api.submit(type="probe", priority=0, params={"steps": 1, "import_torch": False})
    api.post(f"/v1/jobs/{job['id']}/hold")
    with unit_of_work() as s:
        s.execute(update(Job).where(Job.id == job["id"])
                  .values(inputs={"deep": _deep(300)}, metrics_summary={"big": 2**70}))
    try:
        r = api.get("/v1/jobs", params={"limit": 100})
        assert r.status_code == 200, r.text[:300]
        mine = [j for j in r.json()["data"] if j["id"] == job["id"]][0]
        assert mine["metrics_summary"]["big"] == 2**70
        assert api.get(f"/v1/jobs/{job['id']}").status_code == 200
    finally:
        with unit_of_work() as s:
            s.execute(update(Job).where(Job.id == job["id"]).values(inputs={},
                                                                     metrics_summary={}))
        api.post(f"/v1/jobs/{job['id']}/cancel")


# ---- 6: never a 500 -----------------------------------------------------------------------

def test_lone_surrogates_and_huge_integers_are_4xx(api, member):
    for path, text in (
            ("/v1/datasets/mix", '{"name": "m", "sources": [{"dataset_id": "\\ud800"}]}'),
            ("/v1/jobs", '{"type": "ingest", "inputs": {"source": {"path": "a.jsonl", '
                         '"name": "\\udc00x"}}}'),
            ("/v1/jobs", '{"type": "ingest", "inputs": {"source": {"path": "\\ud800"}}}'),
            ("/v1/jobs", '{"type": "probe", "params": {"k": "\\ud800"}}'),
            ("/v1/jobs", '{"type": "ingest", "inputs": {"source": {"path": "a.jsonl", '
                         f'"name": {2**70}}}}}}}'),
            ("/v1/jobs", f'{{"type": "probe", "params": {{"steps": {2**70}}}}}'),
            ("/v1/jobs", f'{{"type": "probe", "inputs": {{"n": {2**70}}}}}'),
            ("/v1/jobs", f'{{"type": "probe", "priority": {2**70}}}')):
        for headers in ({}, {"Idempotency-Key": uuid.uuid4().hex}):
            r = _raw(member.c, path, text, **headers)
            assert 400 <= r.status_code < 500, (path, text, r.status_code, r.text[:300])
            _err(r, r.status_code)


def test_nul_or_traversal_in_an_artifact_file_path_is_404(api, home):
    from app.core.db import unit_of_work
    from app.core.ids import new_id
    from app.models import Artifact

    folder = home / "artifacts" / "dataset" / f"art-{uuid.uuid4().hex[:6]}"
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text("{}")
    art_id = new_id("art")
    with unit_of_work() as s:
        s.add(Artifact(id=art_id, kind="dataset", uri=str(folder), bytes=2, files=[],
                       inputs=[], meta={}))
    assert api.get(f"/v1/artifacts/{art_id}/files/meta.json").text == "{}"
    for bad in ("meta%00.json", "%00", "..%2F..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd"):
        _err(api.get(f"/v1/artifacts/{art_id}/files/{bad}"), 404)


def test_concurrent_requests_with_one_idempotency_key_get_the_first_answer(api):
    key = f"race-{uuid.uuid4().hex}"
    body = {"type": "probe", "priority": 0, "params": {"steps": 1, "import_torch": False}}
    out: list[httpx.Response] = []
    go = threading.Barrier(6)

    def post():
        with httpx.Client(base_url=api.url, timeout=30,
                          headers={"Authorization": f"Bearer {api.token}"}) as c:
            go.wait()
            out.append(c.post("/v1/jobs", json=body, headers={"Idempotency-Key": key}))
    threads = [threading.Thread(target=post) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.status_code for r in out] == [201] * 6, [r.text[:200] for r in out]
    ids = {r.json()["id"] for r in out}
    assert len(ids) == 1
    assert sum(r.headers.get("idempotent-replayed") == "true" for r in out) == 5
    api.post(f"/v1/jobs/{ids.pop()}/cancel")


# ---- 7: smaller ---------------------------------------------------------------------------

def test_405_carries_allow(api):
    r = api.c.delete("/v1/jobs")
    _err(r, 405)
    assert set(r.headers["allow"].replace(" ", "").split(",")) == {"GET", "POST"}


def test_openapi_lists_error_responses_and_the_upload_body(server):
    spec = httpx.get(f"{server}/openapi.json").json()
    post = spec["paths"]["/v1/jobs"]["post"]
    for code in ("400", "401", "403", "404", "409", "413", "422", "429", "503"):
        assert code in post["responses"], code
    schema = post["responses"]["422"]["content"]["application/json"]["schema"]
    assert schema["$ref"].endswith("/ErrorBody")
    body = spec["paths"]["/v1/datasets"]["post"]["requestBody"]["content"]
    assert body["multipart/form-data"]["schema"]["properties"]["file"]["format"] == "binary"
    assert "path" in body["application/json"]["schema"]["properties"]


def test_docs_load_nothing_from_a_cdn(server):
    page = httpx.get(f"{server}/docs")
    assert page.status_code == 200
    assert "cdn" not in page.text.lower() and "https://" not in page.text
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        r = httpx.get(f"{server}/docs/assets/{asset}")
        assert r.status_code == 200 and len(r.content) > 10_000
        assert f"/docs/assets/{asset}" in page.text
    assert httpx.get(f"{server}/redoc", follow_redirects=False).headers["location"] == "/docs"


def test_creating_a_user_returns_the_token_id(api):
    u = api.post("/v1/users", {"name": f"tok-{uuid.uuid4().hex[:6]}", "role": "member"}).json()
    assert u["token_id"].startswith("tok_")
    me = api.as_(u["token"])
    assert me.get("/v1/users/me").status_code == 200
    assert me.delete(f"/v1/tokens/{u['token_id']}").status_code == 204
    wait_for(lambda: me.get("/v1/users/me").status_code == 401, 10, 0.2, "the token revoked")


def test_the_sqlite_file_is_private(tmp_path):
    from sqlalchemy import text

    from app.core.db import make_engine

    eng = make_engine(f"sqlite:///{tmp_path / 'home' / 'draftyard.db'}")
    with eng.connect() as c:
        c.execute(text("CREATE TABLE t (a int)"))
        c.commit()
    eng.dispose()
    assert (tmp_path / "home" / "draftyard.db").stat().st_mode & 0o777 == 0o600


def test_probe_sleep_is_bounded(api):
    e = _err(api.post("/v1/jobs", {"type": "probe", "params": {"sleep_s": 86400}}), 422)
    assert e["param"] == "params.sleep_s"


def test_a_mix_seed_beyond_64_bits_is_422(api):
    up = api.c.post("/v1/datasets", files={"file": ("s.jsonl", b'{"prompt": "hi"}\n')},
                    data={"name": "seed-src"})
    assert up.status_code == 201, up.text
    try:
        e = _err(api.post("/v1/datasets/mix", {"name": "m", "seed": 2**70,
                                               "sources": [{"dataset_id": up.json()["id"]}]}),
                 422)
        assert e["param"] == "seed"
    finally:
        api.post(f"/v1/jobs/{up.json()['job_id']}/cancel")


# ---- no code from a request (docs/API-additions.md) ------------------------------------

# What a member could once send to run a program on the worker, and each field's name.
CODE_FIELDS = [
    ("generate", {"backend": "vllm", "vllm": {"executable": ["/bin/sh", "-c",
                                                            "id > marker.txt; exit 7"]}},
     "params.vllm.executable"),
    ("generate", {"backend": "vllm", "vllm": {"extra_args": ["--chat-template",
                                                            "/etc/passwd"]}},
     "params.vllm.extra_args"),
    ("extract", {"backend": "vllm", "vllm": {"python": "/bin/sh"}}, "params.vllm.python"),
    ("extract", {"backend": "vllm", "vllm": {"extra_args": ["--worker-cls", "os.system"]}},
     "params.vllm.extra_args"),
    ("extract", {"backend": "vllm", "vllm": {"host": "0.0.0.0"}}, "params.vllm.host"),
    ("extract", {"attn_implementation": "kernels-community/evil"},
     "params.attn_implementation"),
    ("evaluate", {"vllm_args": ["--trust-remote-code"]}, "params.vllm_args"),
]


@pytest.mark.parametrize("type_, params, field", CODE_FIELDS, ids=[f[2] for f in CODE_FIELDS])
def test_a_job_cannot_name_a_program_interpreter_module_or_flag(api, member, home, type_,
                                                               params, field):
    """The repro of a reported escape (a member ran `/bin/sh` as the worker's user through
    params.vllm.executable) and its class: 422 naming the field, before anything is queued;
    nothing ran (no marker anywhere under the server's home)."""
    def newest() -> list[str]:  # ids only: an earlier test's job may still change status
        return [j["id"] for j in api.get("/v1/jobs", params={"limit": 1}).json()["data"]]

    before = newest()
    r = member.post("/v1/jobs", {"type": type_, "params": params})
    e = _err(r, 422)
    assert e["param"] == field, e
    assert newest() == before  # nothing queued
    assert not list(home.rglob("marker.txt"))


def test_a_run_cannot_smuggle_one_through_a_stage(member):
    e = _err(member.post("/v1/runs", {
        "name": "x", "target_id": "t", "dataset_id": "d",
        "drafter": {"type": "dflash"},
        "stages": {"generate": {"backend": "vllm", "vllm": {"executable": ["/bin/sh"]}}}}), 422)
    assert "executable" in (e["param"] or "") + e["message"], e


def test_typed_vllm_options_are_accepted_and_bounded(member):
    """What a job may set instead (docs/API-additions.md): typed, bounded engine options."""
    e = _err(member.post("/v1/jobs", {"type": "generate", "params": {"vllm": {
        "max_num_seqs": 10**6}}}), 422)
    assert e["param"] == "params.vllm.max_num_seqs"
    e = _err(member.post("/v1/jobs", {"type": "generate", "params": {"vllm": {
        "dtype": "--trust-remote-code"}}}), 422)
    assert e["param"] == "params.vllm.dtype"
