"""No request without a token makes the API hold more than a few KiB, and a
Content-Type does not choose a route's body cap.

One throwaway API with the default caps (2 GiB uploads, 8 MiB JSON): the memory it holds is
read from /proc of that process (VmHWM, its peak resident set)."""

from __future__ import annotations

import select
import socket
import time
import uuid

import pytest

from app.core.middleware import UNAUTHENTICATED_BODY_BYTES
from tests.conftest import REDIS_DBS
from tests.service.stack import running
from tests.service.test_api_errors import _err

MB = 1 << 20


@pytest.fixture(scope="module")
def big():
    with running("bodies", REDIS_DBS[2]) as st:
        yield st


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(x.split()[1]) * 1024 for x in fh if x.startswith("VmHWM:"))


def _answer(s: socket.socket) -> tuple[int, bytes]:
    buf = b""
    s.settimeout(10)
    while b"\r\n\r\n" not in buf or len(buf.partition(b"\r\n\r\n")[2]) < _length(buf):
        got = s.recv(65536)
        if not got:
            break
        buf += got
    head, _, body = buf.partition(b"\r\n\r\n")
    return int(head.split()[1]), body[:_length(buf)]


def _length(buf: bytes) -> int:
    for line in buf.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 30


def _stream(url: str, head: str, total: int, chunk: int = MB) -> tuple[int, bytes, int, float]:
    """POST a chunked body of `total` bytes by hand, stopping as soon as the server answers
    (or stops reading). Returns (status, body, bytes sent, seconds)."""
    host, port = url.removeprefix("http://").split(":")
    piece = f"{chunk:x}\r\n".encode() + b"x" * chunk + b"\r\n"
    sent, t0 = 0, time.monotonic()
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(head.encode())
        while sent < total:
            if select.select([s], [], [], 0)[0]:
                break  # the answer came before the body ended
            try:
                s.sendall(piece)
            except (BrokenPipeError, ConnectionResetError, TimeoutError, socket.timeout):
                break  # the server stopped reading
            sent += chunk
        status, body = _answer(s)
    return status, body, sent, time.monotonic() - t0


def _head(path: str, ctype: str, token: str | None = None) -> str:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: {ctype}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n")


def test_600_mb_multipart_without_a_token_on_a_json_route_costs_the_api_nothing(big):
    pid = big.procs[0].pid
    before = _peak_rss(pid)
    status, body, sent, took = _stream(
        big.url, _head("/v1/jobs", f"multipart/form-data; boundary={uuid.uuid4().hex}"),
        600 * MB)
    grew = _peak_rss(pid) - before
    print(f"peak RSS {before / MB:.0f} MB -> {(before + grew) / MB:.0f} MB; "
          f"{sent / MB:.0f} MB sent before the answer; {took:.2f} s; {status} {body[:200]!r}")
    assert status == 401 and b"missing_token" in body, (status, body)
    assert grew < 50 * MB, f"the API grew by {grew / MB:.0f} MB"
    assert sent < 100 * MB and took < 10


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/datasets", "/v1/runs", "/v1/webhooks"])
def test_without_a_valid_token_nothing_past_the_small_bound_is_read(big, path):
    for token, code in ((None, "missing_token"), ("dy_not-a-token", "invalid_token")):
        status, body, sent, _ = _stream(big.url, _head(path, "application/json", token),
                                        50 * MB, 16 * 1024)
        assert status == 401 and code.encode() in body, (path, status, body)
        assert sent < 20 * MB, sent
    # declared up front: refused before a byte of the body is read
    with socket.create_connection(("127.0.0.1", int(big.url.rsplit(":", 1)[1])), 5) as s:
        s.sendall((f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {UNAUTHENTICATED_BODY_BYTES + 1}\r\n\r\n").encode())
        assert _answer(s)[0] == 401


def test_multipart_on_a_json_route_keeps_the_json_cap(big):
    """With a valid token: 8 MiB on /v1/jobs whatever the Content-Type says."""
    status, body, sent, _ = _stream(
        big.url, _head("/v1/jobs", f"multipart/form-data; boundary={uuid.uuid4().hex}",
                       big.token), 64 * MB)
    assert status == 413 and b"DRAFTYARD_MAX_BODY_BYTES" in body, (status, body)
    assert sent < 40 * MB


def test_small_bodies_without_a_token_keep_their_answers(big):
    import httpx

    # malformed JSON without a token is a 401 like any other body
    # (tests/service/test_security_probe.py), and 400 with one
    _err(httpx.post(f"{big.url}/v1/jobs", content=b'{"type": ', headers={
        "content-type": "application/json"}), 401, "missing_token")
    _err(httpx.post(f"{big.url}/v1/jobs", json={"type": "probe"}), 401, "missing_token")
    # a body just under the bound is read like any other
    unfinished = b'{"name": "' + b"x" * (UNAUTHENTICATED_BODY_BYTES - 20)
    _err(httpx.post(f"{big.url}/v1/jobs", content=unfinished,
                    headers={"content-type": "application/json"}), 401, "missing_token")
    with big.client() as c:
        _err(c.post("/v1/jobs", content=unfinished, headers={
            "content-type": "application/json"}), 400, "malformed_json")
    # and an upload, with a token, still streams in under its own cap
    with big.client() as c:
        r = c.post("/v1/datasets", files={"file": ("a.jsonl", b'{"prompt": "hi"}\n' * 40_000)},
                   data={"name": "big-enough"})
        assert r.status_code == 201, r.text
        c.post(f"/v1/jobs/{r.json()['job_id']}/cancel")
