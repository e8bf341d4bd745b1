"""Deleting artifacts and datasets: refused while a live job needs them, tombstones
that keep lineage, a clear error for later jobs, reuse that misses a tombstone, and a delete
interrupted by SIGKILL that leaves either the artifact or its tombstone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.service.test_datasets import _ready, _upload
from tests.stages.conftest import shared_fixtures


@pytest.fixture(scope="module")
def target(api, home) -> dict:
    from tests.tiny import tiny_model

    d = tiny_model(home / "models" / "tiny-storage", arch="qwen3")
    r = api.post("/v1/targets", {"name": "tiny-storage", "path": str(d)})
    assert r.status_code == 201, r.text
    return r.json()


def _dataset(client, name: str) -> dict:
    r = _upload(client, shared_fixtures() / "datasets" / "sharegpt.jsonl", name)
    assert r.status_code == 201, r.text
    d = _ready(client, r.json()["id"])
    assert d["status"] == "ready", d
    return d


def _waiting_job(client, target: dict, dataset_ref) -> dict:
    """A job that needs the dataset and stays queued (no node has 64 GPUs)."""
    return client.submit(type="generate", gpus=64, inputs={"dataset": dataset_ref,
                                                           "target": target["id"]})


def test_delete_refused_while_needed_then_tombstone_keeps_lineage(api, worker, member, target):
    d = _dataset(member, f"del-{uuid.uuid4().hex[:4]}")
    art_id = d["artifact_id"]
    # the folder from an admin's read: members see `artifacts:<rel>`
    art = api.get(f"/v1/artifacts/{art_id}").json()
    assert art["bytes"] > 0 and art["deleted_at"] is None and Path(art["uri"]).is_dir()
    # A run's later stage names an earlier one as {"job": ...}: that counts as needing it.
    by_job = _waiting_job(member, target, {"job": d["job_id"]})
    by_ds = _waiting_job(member, target, d["id"])
    other = api.post("/v1/users", {"name": f"o-{uuid.uuid4().hex[:6]}", "role": "member"})
    r = api.as_(other.json()["token"]).delete(f"/v1/artifacts/{art_id}")
    assert r.status_code == 403 and r.json()["error"]["code"] == "not_owner", r.text
    r = member.delete(f"/v1/artifacts/{art_id}")
    assert r.status_code == 409, r.text
    err = r.json()["error"]
    assert err["code"] == "artifact_in_use" and by_job["id"] in err["message"]
    assert set(err["details"]["jobs"]) == {by_job["id"], by_ds["id"]}
    r = member.delete(f"/v1/datasets/{d['id']}")
    assert r.status_code == 409 and by_ds["id"] in r.json()["error"]["message"], r.text
    assert Path(art["uri"]).is_dir()  # nothing removed by a refusal
    for j in (by_job, by_ds):
        assert member.post(f"/v1/jobs/{j['id']}/cancel").status_code == 200

    r = member.delete(f"/v1/artifacts/{art_id}")
    assert r.status_code == 200, r.text
    tomb = r.json()
    assert tomb["deleted_at"] and tomb["deleted_by"] == member.get("/v1/users/me").json()["id"]
    assert tomb["bytes_freed"] == art["bytes"] > 0
    assert not Path(art["uri"]).exists()
    # Lineage still reads: the row, its producer and inputs, and the job that made it.
    again = member.get(f"/v1/artifacts/{art_id}").json()
    assert again["producer_job"] == d["job_id"] and again["deleted_at"] == tomb["deleted_at"]
    assert member.get(f"/v1/jobs/{d['job_id']}").json()["outputs"] == [art_id]
    r = member.get(f"/v1/artifacts/{art_id}/files/data.parquet")
    assert r.status_code == 410 and r.json()["error"]["code"] == "artifact_deleted", r.text
    # A later job that needs it: refused at submit, naming the artifact.
    for ref in (d["id"], {"job": d["job_id"]}, art_id):
        inputs = {"dataset": ref, "target": target["id"]}
        r = member.post("/v1/jobs", {"type": "prepare", "inputs": inputs})
        assert r.status_code == 409, r.text
        assert r.json()["error"]["code"] == "input_deleted" and art_id in r.text
    # Deleting twice reads the same tombstone.
    assert member.delete(f"/v1/artifacts/{art_id}").json()["deleted_at"] == tomb["deleted_at"]


def test_dataset_delete_removes_its_files(api, worker, member, home):
    d = _dataset(member, f"dsdel-{uuid.uuid4().hex[:4]}")
    uri = Path(api.get(f"/v1/artifacts/{d['artifact_id']}").json()["uri"])
    upload = home / "uploads" / d["id"]
    assert uri.is_dir() and upload.is_dir()
    assert member.delete(f"/v1/datasets/{d['id']}").status_code == 204
    assert not uri.exists() and not upload.exists()
    art = member.get(f"/v1/artifacts/{d['artifact_id']}").json()
    assert art["deleted_at"] and art["bytes_freed"] > 0


def test_a_queued_job_whose_input_was_deleted_fails_naming_it(api, worker, member, target):
    """A job submitted before the delete and not yet resolved by the scheduler (a delete
    that raced its submit): it fails with input_deleted at the next scheduling pass, naming
    the artifact, instead of waiting forever or failing in the worker."""
    from app.core.db import unit_of_work, utcnow
    from app.models import Artifact, Job

    d = _dataset(member, f"q-{uuid.uuid4().hex[:4]}")
    j = _waiting_job(member, target, d["id"])
    with unit_of_work() as s:
        a = s.get(Artifact, d["artifact_id"])
        a.deleted_at, a.deleted_by, a.bytes_freed = utcnow(), "retention", a.bytes
        s.get(Job, j["id"]).fingerprint = None  # as a job the scheduler has not seen yet
    member.submit(type="probe", params={"import_torch": False})  # a scheduling pass
    done = member.wait_job(j["id"], timeout=30)
    assert done["status"] == "failed" and done["error"]["code"] == "input_deleted", done
    assert d["artifact_id"] in done["error"]["message"]


def test_reuse_misses_a_tombstone_and_reruns(api, worker, home):
    """Two identical ingest jobs of one server path: the second reuses the first, unless the
    first's artifact is a tombstone, even one whose files a killed delete left in place."""
    from app.core.db import unit_of_work, utcnow
    from app.models import Artifact

    src = home / "data" / f"reuse-{uuid.uuid4().hex[:6]}.jsonl"
    src.write_bytes((shared_fixtures() / "datasets" / "sharegpt.jsonl").read_bytes())
    body = {"type": "ingest", "inputs": {"source": {"path": str(src), "name": "reuse-me"}},
            "params": {"format": "sharegpt", "dataset_name": "reuse-me"}}
    first = api.wait_job(api.submit(**body)["id"])
    second = api.wait_job(api.submit(**body)["id"])
    assert first["status"] == second["status"] == "succeeded", (first, second)
    assert second["reused_from"] == first["id"] and second["outputs"] == first["outputs"]
    with unit_of_work() as s:  # tombstone committed, files not yet removed (killed there)
        a = s.get(Artifact, first["outputs"][0])
        a.deleted_at, a.deleted_by, a.bytes_freed = utcnow(), "usr_x", a.bytes
    assert Path(a.uri).is_dir()
    third = api.wait_job(api.submit(**body)["id"])
    assert third["status"] == "succeeded" and third["reused_from"] is None, third
    assert third["outputs"] and third["outputs"] != first["outputs"]


# ---- an interrupted delete ---------------------------------------------------------------

_KILLABLE = textwrap.dedent("""
    import sys, time
    from app.wiring import wire
    from app.core.auth import Principal
    from app.core.db import unit_of_work
    from app.models import Artifact
    from app.storage import delete

    wire()
    art_id, where = sys.argv[1], sys.argv[2]

    def pause(label):
        print(label, flush=True)
        time.sleep(120)

    if where == "before_commit":
        real = delete.tombstone
        def tombstone(s, a, by):
            real(s, a, by)
            s.flush()
            pause("PAUSED")  # tombstone written, not committed
        delete.tombstone = tombstone
    else:  # mid-unlink: renamed into the trash, one file removed, the rest still there
        import shutil, types
        def rmtree(p, ignore_errors=False):
            next(f for f in sorted(__import__("pathlib").Path(p).rglob("*")) if f.is_file()).unlink()
            pause("PAUSED")
        delete.shutil = types.SimpleNamespace(rmtree=rmtree)
    with unit_of_work() as s:
        a = s.get(Artifact, art_id)
        delete.delete_artifact(s, Principal("usr_admin", "admin", "admin"), a)
""")


def _fake_artifact(home: Path) -> tuple[str, Path]:
    """An artifact row with 20 files on disk, as publish leaves one."""
    from app.core.db import unit_of_work
    from app.core.ids import new_id
    from app.models import Artifact

    art_id = new_id("art")
    folder = home / "artifacts" / "tokenized" / art_id
    folder.mkdir(parents=True)
    for i in range(20):
        (folder / f"part-{i:02d}.bin").write_bytes(os.urandom(1000))
    with unit_of_work() as s:
        s.add(Artifact(id=art_id, kind="tokenized", uri=str(folder), bytes=20_000,
                       files=[], owner_id=None))
    return art_id, folder


def _kill_while(art_id: str, where: str, home: Path) -> None:
    p = subprocess.Popen([sys.executable, "-c", _KILLABLE, art_id, where], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    line = p.stdout.readline()
    assert line.strip() == "PAUSED", line + p.stdout.read()
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(10)
    assert p.returncode == -signal.SIGKILL


@pytest.mark.parametrize("where", ["before_commit", "mid_unlink"])
def test_delete_killed_midway_leaves_artifact_or_tombstone(database, server, home, where):
    from app.core.db import unit_of_work
    from app.models import Artifact
    from app.storage.delete import check_storage

    art_id, folder = _fake_artifact(home)
    _kill_while(art_id, where, home)
    with unit_of_work(read_only=True) as s:
        a = s.get(Artifact, art_id)
        deleted = a.deleted_at is not None
    trash = home / "artifacts" / ".trash" / art_id
    if where == "before_commit":
        # Killed before the commit: the artifact, whole.
        assert not deleted and len(list(folder.iterdir())) == 20
    else:
        # Killed after it: the tombstone, its files partly still in the trash.
        assert deleted and not folder.exists() and 0 < len(list(trash.iterdir())) < 20
    report = check_storage()
    assert art_id not in report["missing"]
    assert (art_id in report["finished"]) == deleted
    assert not trash.exists()
    assert folder.exists() != deleted


def test_startup_check_reports_a_row_without_files(database, server, home):
    import shutil

    from app.storage.delete import check_storage

    art_id, folder = _fake_artifact(home)
    shutil.rmtree(folder)  # what the mark-then-remove order never does: found and reported
    assert art_id in check_storage()["missing"]
