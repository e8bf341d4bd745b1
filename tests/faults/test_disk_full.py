"""Disk full during an artifact write: the deployment's home (jobs' work and output
folders, artifacts) is a small tmpfs, nearly filled before an ingest writes its Parquet. The
job must fail once with a clear error, leave no artifact (no row, nothing half-written), and
a retry after space is freed must succeed with a whole artifact. Needs root (mount)."""

from __future__ import annotations

import base64
import json
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.faults.harness import TERMINAL, FaultStack


@pytest.fixture
def small_fs():
    d = Path(tempfile.mkdtemp(prefix="draftyard-smallfs-"))
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(d)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)
        shutil.rmtree(d, ignore_errors=True)


def _records(path: Path, n: int) -> None:
    rnd = random.Random(17)
    with open(path, "w") as fh:
        for i in range(n):  # random text: Parquet cannot compress it away
            text = base64.b64encode(rnd.randbytes(720)).decode()
            fh.write(json.dumps({"id": f"r{i}", "prompt": text}) + "\n")


@pytest.mark.slow  # ~70 s on 2 cores: two ingests of 8 MB and a deployment of its own
def test_disk_full_during_artifact_write_fails_once_cleanly_and_retry_succeeds(small_fs):
    data = Path(tempfile.mkdtemp(prefix="draftyard-fulldata-"))
    fs = FaultStack(stale_s=6, home=small_fs / "home",
                    settings={"DRAFTYARD_DATA_ROOTS": str(data)})
    (small_fs / "home").mkdir()
    try:
        fs.up()
        # Another job's artifact, made before the disk fills: it must stay whole.
        small = data / "small.jsonl"
        _records(small, 300)
        with fs.client() as c:
            r = c.post("/v1/datasets", json={"name": "small", "path": str(small)})
        assert r.status_code == 201, r.text
        fs.jobs.append(r.json()["job_id"])
        other = fs.wait(lambda: (x := fs.get(f"/v1/datasets/{r.json()['id']}").json())[
            "status"] != "ingesting" and x, 120, "the small ingest")
        assert other["status"] == "ready", other
        other_art = fs.get(f"/v1/artifacts/{other['artifact_id']}").json()
        src = data / "big.jsonl"
        _records(src, 8000)  # ~8 MB on the ordinary disk; its Parquet ~7 MB on the small one
        filler = small_fs / "filler"
        free = shutil.disk_usage(small_fs).free
        with open(filler, "wb") as fh:  # leave ~2 MB: logs and specs fit, the artifact not
            fh.write(b"\0" * max(0, free - 2_000_000))
        with fs.client() as c:
            r = c.post("/v1/datasets", json={"name": "full", "path": str(src)})
        assert r.status_code == 201, r.text
        job_id = r.json()["job_id"]
        fs.jobs.append(job_id)
        j = fs.wait(lambda: (x := fs.job(job_id))["status"] in TERMINAL and x, 120,
                    "the ingest to end")
        assert j["status"] == "failed", j
        err = j["error"]
        assert "No space left on device" in json.dumps(err), err
        print("error while the disk was full:", err["code"], err["message"][:200])
        assert err["code"] == "disk_full", err  # named as such, not a crash
        arts = small_fs / "home" / "artifacts"
        assert [p.name for p in arts.glob("*/*")] == [other_art["id"]]  # only the other one
        other_dir = Path(other_art["uri"])
        assert all((other_dir / f["path"]).stat().st_size == f["bytes"]
                   for f in other_art["files"])
        assert not list((small_fs / "home" / "jobs" / job_id).glob("out-*")), \
            "a half-written output was left behind"
        with fs.stack.engine().connect() as conn:
            from sqlalchemy import text

            assert not conn.execute(text("SELECT id FROM artifacts WHERE producer_job = :j"),
                                    {"j": job_id}).all()

        # A delete needs no space: on the full disk the other dataset's artifact goes to a
        # tombstone and its bytes are freed.
        with fs.client() as c:
            r = c.delete(f"/v1/artifacts/{other_art['id']}")
        assert r.status_code == 200 and r.json()["bytes_freed"] == other_art["bytes"], r.text
        assert not other_dir.exists() and not (arts / ".trash" / other_art["id"]).exists()
        filler.unlink()  # the operator frees space; the job is retried
        t_end = time.monotonic()
        with fs.client() as c:
            assert c.post(f"/v1/jobs/{job_id}/retry").status_code == 200
        j = fs.wait(lambda: (x := fs.job(job_id))["status"] in TERMINAL and x, 120,
                    "the retried ingest to end")
        assert j["status"] == "succeeded", j
        art = Path(fs.get(f"/v1/artifacts/{j['outputs'][0]}").json()["uri"])
        manifest = json.loads((art / "manifest.json").read_text())
        assert all((art / f["path"]).stat().st_size == f["bytes"] for f in manifest["files"])
        fs.check("disk full during an artifact write", recovery_s=time.monotonic() - t_end,
                 retried=(job_id,))
    finally:
        fs.close()
        shutil.rmtree(data, ignore_errors=True)
