"""What an outside probe of the API found: a path past the file system's limits was a 500, a
malformed body without a token was told 400 before 401, and the files a worker writes were
readable by every user of the box."""

from __future__ import annotations

import re
import stat

import httpx
import pytest

from tests.service.test_api_errors import _err

LONG = "x" * 256  # one name past NAME_MAX (255 bytes)
WIDE = "é" * 128  # 128 characters, 256 bytes: the bound is on bytes
# Under the 4096 bytes the contract allows, past PATH_MAX once joined to its root.
DEEP = "/".join(["d" * 200] * 20) + "/" + "f" * 60


@pytest.mark.parametrize("route,body,param", [
    ("/v1/targets", {"name": "t", "path": LONG}, "path"),
    ("/v1/targets", {"name": "t", "path": WIDE}, "path"),
    ("/v1/targets", {"name": "t", "path": "m", "tokenizer_path": f"tok/{LONG}"},
     "tokenizer_path"),
    ("/v1/targets", {"name": "t", "path": DEEP}, "path"),
    ("/v1/datasets", {"name": "d", "path": LONG}, "path"),
    ("/v1/datasets", {"name": "d", "path": "a/" * 2100}, "path"),
    ("/v1/datasets", {"name": "d", "path": DEEP}, "path"),
    ("/v1/jobs", {"type": "ingest", "inputs": {"source": {"path": f"{LONG}.jsonl"}}},
     "inputs.source.path"),
    ("/v1/jobs", {"type": "ingest", "inputs": {"source": {"path": DEEP}}},
     "inputs.source.path"),
])
def test_a_path_past_the_file_system_limits_is_422_naming_the_field(member, route, body, param):
    e = _err(member.post(route, body), 422)
    assert e["param"] == param, e


def _routes_with_a_body(server: str) -> list[tuple[str, str]]:
    spec = httpx.get(f"{server}/openapi.json").json()
    out = []
    for path, ops in spec["paths"].items():
        for method in ("post", "put", "patch", "delete"):
            if method in ops and path.startswith("/v1/"):
                out.append((method.upper(), re.sub(r"\{[^}]+\}", "x_nope", path)))
    return out


@pytest.mark.parametrize("auth", [None, "Bearer dy_not-a-token", "Basic eDp4"])
def test_a_malformed_body_without_a_valid_token_is_401_on_every_route(server, auth):
    """The token is looked at before the body: a caller without one learns nothing about
    what a route expects (every /v1 route of /openapi.json, three bad bodies)."""
    routes = _routes_with_a_body(server)
    assert ("POST", "/v1/jobs") in routes and len(routes) > 15, routes
    headers = {"content-type": "application/json", **({"authorization": auth} if auth else {})}
    wrong = []
    for method, path in routes:
        for body in (b'{"name": ', b"\xff\xfe not utf-8", b"[1, 2"):
            r = httpx.request(method, f"{server}{path}", content=body, headers=headers)
            if r.status_code != 401 or r.json()["error"]["code"] not in (
                    "missing_token", "invalid_token"):
                wrong.append((method, path, body, r.status_code, r.text[:120]))
    assert not wrong, wrong


def test_a_malformed_body_with_a_token_is_still_400(api):
    r = api.c.post("/v1/datasets", content=b'{"name": ', headers={
        "content-type": "application/json"})
    _err(r, 400, "malformed_json")


def test_the_worker_writes_job_folders_and_logs_for_its_user_only(api, worker, home):
    """The worker sets umask 077 itself (its parent here, pytest, has the usual 022)."""
    job = api.submit(type="probe", params={"steps": 1})
    assert api.wait_job(job["id"])["status"] == "succeeded"
    folder = home / "jobs" / job["id"]
    log = folder / "log.txt"
    assert log.is_file()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700, oct(folder.stat().st_mode)
    for f in (p for p in folder.rglob("*")):
        want = 0o700 if f.is_dir() else 0o600
        assert stat.S_IMODE(f.stat().st_mode) == want, (f, oct(f.stat().st_mode))
