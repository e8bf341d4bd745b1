"""One member's stored text does not burden everyone's
listings, and members never see the server's folders in target and artifact reads."""

from __future__ import annotations

import hashlib
import json
import uuid

import pytest

from app.targets.routes import MAX_CHAT_TEMPLATE_CHARS
from tests.service.test_api_errors import _err


def _model(home, name: str) -> str:
    d = home / "models" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "vocab_size": 1000}))
    return name


# ---- 5: stored text bounds -----------------------------------------------------------------

def test_a_chat_template_past_its_bound_is_422_naming_field_and_bound(member, home):
    name = _model(home, f"tb-{uuid.uuid4().hex[:6]}")
    e = _err(member.post("/v1/targets", {"name": "t", "path": name,
                                         "chat_template": "x" * (MAX_CHAT_TEMPLATE_CHARS + 1)}),
             422)
    assert e["param"] == "chat_template" and str(MAX_CHAT_TEMPLATE_CHARS) in e["message"], e
    e = _err(member.post("/v1/targets", {"name": "t", "path": "m/" * 2100}), 422)
    assert e["param"] == "path" and "4096" in e["message"], e
    for field in ("name",):
        e = _err(member.post("/v1/targets", {field: "n" * 201, "path": name}), 422)
        assert e["param"] == field and "200" in e["message"], e


def test_listings_carry_the_template_by_hash_and_the_item_read_whole(member, api, home):
    """A template near the bound is accepted, but `GET /v1/targets` stays small: it carries
    the template's sha256 and length, the item read the text."""
    name = _model(home, f"tl-{uuid.uuid4().hex[:6]}")
    big = "{{ messages }}" + "#" * (MAX_CHAT_TEMPLATE_CHARS - 20)
    r = member.post("/v1/targets", {"name": "big-template", "path": name, "chat_template": big})
    assert r.status_code == 201, r.text[:300]
    tid = r.json()["id"]
    sha = hashlib.sha256(big.encode()).hexdigest()
    one = member.get(f"/v1/targets/{tid}").json()
    assert one["chat_template"] == big
    assert one["chat_template_sha256"] == sha and one["chat_template_chars"] == len(big)
    listing = api.get("/v1/targets", params={"limit": 100})
    assert listing.status_code == 200
    assert len(listing.content) < 20_000 * max(1, len(listing.json()["data"])), \
        len(listing.content)
    mine = [t for t in listing.json()["data"] if t["id"] == tid][0]
    assert "chat_template" not in mine
    assert mine["chat_template_sha256"] == sha and mine["chat_template_chars"] == len(big)
    assert mine["has_chat_template"] is True


# ---- 7: no server paths in members' reads --------------------------------------------------

def test_target_reads_show_members_no_absolute_paths(member, api, home):
    name = _model(home, f"tp-{uuid.uuid4().hex[:6]}")
    r = member.post("/v1/targets", {"name": "paths", "path": name})
    assert r.status_code == 201, r.text
    tid = r.json()["id"]
    roots = (str(home), str(home.resolve()))
    for body in (r.json(), member.get(f"/v1/targets/{tid}").json(),
                 [t for t in member.get("/v1/targets", params={"limit": 100}).json()["data"]
                  if t["id"] == tid][0]):
        assert body["path"] == f"models:{name}" and body["tokenizer_path"] == f"models:{name}"
        assert not any(root in json.dumps(body) for root in roots), body
    # admins see where it is
    assert api.get(f"/v1/targets/{tid}").json()["path"] == str((home / "models" / name).resolve())


@pytest.fixture
def artifact(home):
    from app.core.db import unit_of_work
    from app.core.ids import new_id
    from app.models import Artifact

    folder = home / "artifacts" / "drafter" / f"art-{uuid.uuid4().hex[:6]}"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    art_id = new_id("art")
    target = home / "models" / "qwen"
    with unit_of_work() as s:
        s.add(Artifact(id=art_id, kind="drafter", uri=str(folder), bytes=2,
                       files=[{"path": "config.json", "bytes": 2}], inputs=[], meta={
                           "serve_command": f"vllm serve {target} --speculative-config "
                                            f"'{{\"model\": \"{folder}\"}}'"}))
    return art_id, folder, target


def test_artifact_reads_show_members_no_absolute_paths(member, api, home, artifact):
    art_id, folder, target = artifact
    rel = folder.relative_to(home / "artifacts")
    one = member.get(f"/v1/artifacts/{art_id}").json()
    listed = [a for a in member.get("/v1/artifacts", params={"kind": "drafter", "limit": 100})
              .json()["data"] if a["id"] == art_id][0]
    for body in (one, listed):
        assert body["uri"] == f"artifacts:{rel}", body
        assert body["meta"]["serve_command"] == (
            f"vllm serve models:qwen --speculative-config '{{\"model\": \"artifacts:{rel}\"}}'")
        assert str(home) not in json.dumps(body)
    # the files are still there to download, and admins see the real folder
    assert member.get(f"/v1/artifacts/{art_id}/files/config.json").text == "{}"
    assert api.get(f"/v1/artifacts/{art_id}").json()["uri"] == str(folder)


def test_dataset_reads_show_members_no_absolute_paths(member, api, home):
    name = f"src-{uuid.uuid4().hex[:6]}.jsonl"
    (home / "data" / name).write_text('{"prompt": "hi"}\n')
    r = member.post("/v1/datasets", {"name": "by-path", "path": name})
    assert r.status_code == 201, r.text
    d = r.json()
    try:
        for body in (d, member.get(f"/v1/datasets/{d['id']}").json()):
            assert body["source"] == {"path": f"data:{name}"}, body
            assert str(home) not in json.dumps(body)
        assert api.get(f"/v1/datasets/{d['id']}").json()["source"]["path"] == \
            str((home / "data" / name).resolve())
    finally:
        member.post(f"/v1/jobs/{d['job_id']}/cancel")


def test_job_reads_show_members_no_absolute_paths(member, api, home):
    """An ingest job's inputs carry the server path of the uploaded file: members read it
    as `uploads:<file>` in the job, the job list, its events and the cancel answer; admins
    read the real path."""
    r = member.c.post("/v1/datasets", data={"name": f"up-{uuid.uuid4().hex[:6]}"},
                      files={"file": ("mine.jsonl", b'{"prompt": "hi"}\n')})
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]
    try:
        one = member.get(f"/v1/jobs/{job_id}").json()
        path = one["inputs"]["source"]["path"]
        assert path.startswith("uploads:") and path.endswith("mine.jsonl"), one["inputs"]
        listed = [j for j in member.get("/v1/jobs", params={"type": "ingest", "limit": 100})
                  .json()["data"] if j["id"] == job_id]
        events = member.get(f"/v1/jobs/{job_id}/events").json()
        for body in (one, listed, events):
            assert str(home) not in json.dumps(body), body
        real = api.get(f"/v1/jobs/{job_id}").json()["inputs"]["source"]["path"]
        assert real.startswith(str(home)) and real.endswith("mine.jsonl"), real
    finally:
        cancelled = member.post(f"/v1/jobs/{job_id}/cancel")
    assert str(home) not in cancelled.text, cancelled.text
