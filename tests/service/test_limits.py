"""The limits hold on what arrives, not on what the client declares.
One throwaway API (tests/service/stack.py) with small caps and, where this process may mount,
a 512 KiB tmpfs as its upload storage (disk full)."""

from __future__ import annotations

import fcntl
import gzip
import json
import socket
import subprocess
import uuid
from urllib.parse import urlparse

import pytest

from tests.conftest import REDIS_DBS
from tests.service.stack import Stack
from tests.service.test_api_errors import _err

CAP_UPLOAD = 1_000_000
CAP_BODY = 100_000


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    (models / "m").mkdir()
    (models / "m" / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "vocab_size": 1000}))
    st = Stack("limits", REDIS_DBS[2], {"DRAFTYARD_MAX_UPLOAD_BYTES": str(CAP_UPLOAD),
                              "DRAFTYARD_MAX_BODY_BYTES": str(CAP_BODY),
                              "DRAFTYARD_MAX_DECOMPRESSED_BYTES": "2000000",
                              "DRAFTYARD_MAX_CONCURRENT_PLANS": "1",
                              "DRAFTYARD_MODEL_ROOTS": str(models)})
    st.create()
    uploads = st.home / "uploads"
    uploads.mkdir()
    st.tmpfs = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs",
                               str(uploads)], capture_output=True).returncode == 0
    try:
        st.start_api()
        yield st
    finally:
        if st.tmpfs:
            subprocess.run(["umount", "-l", str(uploads)], check=False)
        st.close()


def _raw(url: str, head: str, chunks, timeout: float = 15) -> tuple[int, dict]:
    """Send a request by hand and read the answer while the body is still unfinished: a
    server that waits for the whole body never answers (the socket times out)."""
    u = urlparse(url)
    with socket.create_connection((u.hostname, u.port), timeout=timeout) as s:
        s.sendall(head.encode())
        for c in chunks:
            try:
                s.sendall(c)
            except (BrokenPipeError, ConnectionResetError):
                break
        buf = b""
        while b"\r\n\r\n" not in buf:
            got = s.recv(65536)
            if not got:
                break
            buf += got
        head_b, _, body = buf.partition(b"\r\n\r\n")
        lines = head_b.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length"))
        while len(body) < length:
            got = s.recv(65536)
            if not got:
                break
            body += got
        return status, json.loads(body[:length])


def _head(st: Stack, path: str, ctype: str, extra: str) -> str:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {st.token}\r\n"
            f"Content-Type: {ctype}\r\n{extra}\r\n")


def _chunked(data: bytes, size: int = 16384):
    for i in range(0, len(data), size):
        part = data[i:i + size]
        yield f"{len(part):x}\r\n".encode() + part + b"\r\n"
    # no final 0-chunk: the body never ends, the answer must come anyway


def _nothing_stored(st: Stack) -> None:
    with st.client() as c:
        assert c.get("/v1/datasets").json()["data"] == []
    assert [p.name for p in (st.home / "uploads").iterdir()] == []


def test_a_50_mb_json_body_is_refused_from_its_length(small):
    status, body = _raw(small.url, _head(small, "/v1/jobs", "application/json",
                                         "Content-Length: 52428800\r\n"), [b'{"type": '])
    assert status == 413 and body["error"]["code"] == "payload_too_large", body


def test_a_chunked_json_body_is_capped_on_streamed_bytes(small):
    status, body = _raw(small.url, _head(small, "/v1/jobs", "application/json",
                                         "Transfer-Encoding: chunked\r\n"),
                        _chunked(b'{"type": "probe", "name": "' + b"x" * (3 * CAP_BODY)))
    assert status == 413 and body["error"]["code"] == "payload_too_large", body


def test_a_chunked_upload_is_capped_on_streamed_bytes(small):
    b = uuid.uuid4().hex
    data = (f"--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    data += b'{"prompt": "hello"}\n' * (3 * CAP_UPLOAD // 20)
    status, body = _raw(small.url, _head(small, "/v1/datasets", f"multipart/form-data; "
                                         f"boundary={b}", "Transfer-Encoding: chunked\r\n"),
                        _chunked(data, 65536))
    assert status == 413 and body["error"]["code"] == "payload_too_large", body
    _nothing_stored(small)


def test_a_compressed_upload_is_capped_on_inflated_bytes(small):
    bomb = gzip.compress(b'{"prompt": "hello"}\n' * 200_000)  # 4 MB inflated, ~10 KB sent
    assert len(bomb) < 50_000
    with small.client() as c:
        r = c.post("/v1/datasets", files={"file": ("a.jsonl.gz", bomb)}, data={"name": "bomb"})
    e = _err(r, 413, "decompressed_too_large")
    assert e["param"] == "file"
    _nothing_stored(small)


def test_disk_full_during_an_upload_is_507_and_nothing_half_written(small):
    if not small.tmpfs:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    data = b'{"prompt": "hello"}\n' * (800_000 // 20)  # under the cap, over the 512 KiB disk
    with small.client() as c:
        r = c.post("/v1/datasets", files={"file": ("a.jsonl", data)}, data={"name": "full"})
        e = _err(r, 507, "insufficient_storage")
        assert e["param"] == "file"
        _nothing_stored(small)
        # and the disk is usable again: a small upload goes through
        ok = c.post("/v1/datasets", files={"file": ("b.jsonl", data[:20_000])},
                    data={"name": "fits"})
        assert ok.status_code == 201, ok.text
        c.post(f"/v1/jobs/{ok.json()['job_id']}/cancel")


def test_concurrent_plans_are_bounded(small):
    with small.client() as c:
        tgt = c.post("/v1/targets", json={"name": "m", "path": "m"})
        assert tgt.status_code == 201, tgt.text
        # The body's references are checked before a slot is taken (app/runs/names.py): a
        # dataset that exists, so the answer is the slot's.
        ds = c.post("/v1/datasets", files={"file": ("p.jsonl", b'{"prompt": "hi"}\n')},
                    data={"name": "plan-slots"})
        assert ds.status_code == 201, ds.text
        (small.home / "plans").mkdir(exist_ok=True)
        with open(small.home / "plans" / "slot-0.lock", "a") as held:  # the one slot, busy
            fcntl.flock(held, fcntl.LOCK_EX)
            r = c.post("/v1/plans", json={"name": "p", "target_id": tgt.json()["id"],
                                          "dataset_id": ds.json()["id"],
                                          "drafter": {"type": "dflash"}})
        _err(r, 429, "too_many_plans")


def test_one_user_cannot_hold_every_cpu_slot_while_another_waits(api, member, worker):
    """The session's worker has two CPU slots. A runs two probes; when the short one ends,
    B's waiting job gets the slot before A's older one (two long probes of one
    user held every slot and ingests starved)."""
    from tests.conftest import wait_for

    other = api.post("/v1/users", {"name": f"cpu-{uuid.uuid4().hex[:6]}", "role": "member"})
    other = api.as_(other.json()["token"])
    fast = {"steps": 2, "import_torch": False}
    a1 = member.submit(type="probe", params={"sleep_s": 3, **fast})
    a2 = member.submit(type="probe", params={"sleep_s": 60, **fast})
    try:
        wait_for(lambda: all(api.job(j["id"])["status"] == "running" for j in (a1, a2)), 60,
                 0.2, "A's two probes to run")
        a3 = member.submit(type="probe", params={"sleep_s": 0, **fast})
        b1 = other.submit(type="probe", params={"sleep_s": 0, **fast})
        done = [api.wait_job(j["id"], timeout=90) for j in (b1, a3)]
        assert all(j["status"] == "succeeded" for j in done), done
        assert done[0]["started_at"] < done[1]["started_at"], done
    finally:
        api.post(f"/v1/jobs/{a2['id']}/cancel")
