"""The Python client of the draftyard HTTP API (docs/API.md), the one HTTP client in the tree: the
CLI is built on it. Only httpx; no torch, no server code, so a notebook can import it.

    from draftyard import Client, NotFound
    c = Client()                                  # DRAFTYARD_URL / DRAFTYARD_TOKEN, or config
    ds = c.upload_dataset("orca.jsonl", progress=lambda sent, total: ...)
    ds = c.wait_dataset(ds["id"])
    run = c.create_run({...})                     # the body of POST /v1/runs
    run = c.wait_run(run["id"])
    c.pull_artifact(run["jobs"][-2]["outputs"][0], "drafter/")

Answers are the API's JSON objects (dicts) as docs/API.md documents them; errors are the typed
exceptions of `draftyard.errors`, carrying the API's error object.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Literal

import httpx

from draftyard.errors import ApiError, NotFound, error_for

Json = dict[str, Any]
Progress = Callable[[int, int | None], None]  # (bytes done, total bytes or None)
TERMINAL = ("succeeded", "failed", "cancelled")
DEFAULT_URL = "http://127.0.0.1:8000"


def config_path() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "draftyard" / \
        "config.json"


def resolve_settings(url: str | None = None, token: str | None = None) -> tuple[str, str | None]:
    """Server URL and token: arguments, else `DRAFTYARD_URL` / `DRAFTYARD_TOKEN`, else
    `~/.config/draftyard/config.json` (`{"url", "token"}`), else the embedded admin token in
    `$DRAFTYARD_HOME/admin_token` (what `draftyard up` writes)."""
    cfg: dict = {}
    p = config_path()
    if p.is_file():
        try:
            cfg = json.loads(p.read_text())
        except ValueError:
            cfg = {}
    url = url or os.environ.get("DRAFTYARD_URL") or cfg.get("url") or DEFAULT_URL
    token = token or os.environ.get("DRAFTYARD_TOKEN") or cfg.get("token")
    if not token:
        home = Path(os.environ.get("DRAFTYARD_HOME") or Path.home() / ".draftyard").expanduser()
        f = home / "admin_token"
        if f.is_file():
            token = f.read_text().strip()
    return url.rstrip("/"), token


class _Counting:
    """A file wrapper that reports bytes read, so an upload can show progress; httpx reads
    multipart files in 64 KiB chunks and sizes them with fileno()/fstat."""

    def __init__(self, fh: BinaryIO, total: int | None, progress: Progress):
        self.fh, self.total, self.progress, self.done = fh, total, progress, 0

    def read(self, n: int = -1) -> bytes:
        chunk = self.fh.read(n)
        self.done += len(chunk)
        self.progress(self.done, self.total)
        return chunk

    def __getattr__(self, name: str):
        return getattr(self.fh, name)


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30):
        self.url, self.token = resolve_settings(url, token)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- plumbing -------------------------------------------------------------------
    @staticmethod
    def _check(r: httpx.Response) -> Any:
        if r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = r.text
            raise error_for(r.status_code, body, r.headers.get("x-request-id"))
        if r.status_code == 204:
            return None
        if r.headers.get("content-type", "").startswith("application/json"):
            return r.json()
        return r.text

    def request(self, method: str, path: str, *, params: dict | None = None,
                json_body: Any = None, headers: dict | None = None, **kw) -> Any:
        """Any endpoint: the decoded answer, or a typed `ApiError`."""
        params = {k: v for k, v in (params or {}).items() if v is not None}
        return self._check(self.http.request(method, path, params=params, json=json_body,
                                             headers=headers, **kw))

    def get(self, path: str, **params) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any = None, idempotency_key: str | None = None) -> Any:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self.request("POST", path, json_body=body, headers=headers)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def page(self, path: str, limit: int = 20, after: str | None = None, **filters) -> Json:
        """One page of a list: `{"data", "has_more", "next_after"}`."""
        return self.get(path, limit=limit, after=after, **filters)

    def iter_all(self, path: str, **filters) -> Iterator[Json]:
        """Every item of a list, page after page."""
        after = None
        while True:
            pg = self.page(path, limit=100, after=after, **filters)
            yield from pg["data"]
            if not pg.get("has_more") or not pg.get("next_after"):
                return
            after = pg["next_after"]

    def _wait(self, get: Callable[[], Json], done: Callable[[Json], bool], timeout: float | None,
              poll: float, what: str) -> Json:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            obj = get()
            if done(obj):
                return obj
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{what} not finished after {timeout} s "
                                   f"(status {obj.get('status')})")
            time.sleep(poll)

    # ---- health and identity --------------------------------------------------------
    def ready(self) -> bool:
        try:
            return self.http.get("/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    def me(self) -> Json:
        return self.get("/v1/users/me")

    # ---- targets --------------------------------------------------------------------
    def create_target(self, name: str, path: str, tokenizer_path: str | None = None,
                      chat_template: str | None = None,
                      chat_template_kwargs: dict | None = None) -> Json:
        body = {"name": name, "path": str(path), "tokenizer_path": tokenizer_path,
                "chat_template": chat_template, "chat_template_kwargs": chat_template_kwargs}
        return self.post("/v1/targets", {k: v for k, v in body.items() if v is not None})

    def list_targets(self, limit: int = 20, after: str | None = None) -> Json:
        return self.page("/v1/targets", limit, after)

    def get_target(self, target_id: str) -> Json:
        """A target by id, or by name (names are unique per owner; your own first)."""
        return self._by_name("/v1/targets", "tgt_", target_id, "target")

    # ---- datasets -------------------------------------------------------------------
    def upload_dataset(self, file: str | Path, name: str | None = None, format: str = "auto",  # noqa: A002
                       progress: Progress | None = None, timeout: float = 600) -> Json:
        """Upload a chat-data file (multipart); `progress(sent, total)` is called as bytes
        leave. Answers the dataset, `ingesting`: see `wait_dataset`."""
        file = Path(file)
        total = file.stat().st_size
        name = name or file.name.split(".")[0]
        with open(file, "rb") as fh:
            body: Any = _Counting(fh, total, progress) if progress else fh
            return self._check(self.http.post(
                "/v1/datasets", files={"file": (file.name, body)},
                data={"name": name, "format": format}, timeout=timeout))

    def add_dataset(self, name: str, path: str | Path, format: str = "auto") -> Json:  # noqa: A002
        """A dataset from a file already on the server, inside DRAFTYARD_DATA_ROOTS."""
        return self.post("/v1/datasets", {"name": name, "path": str(path), "format": format})

    def mix_datasets(self, name: str, sources: list[dict], dedupe: bool = True,
                     seed: int = 0) -> Json:
        return self.post("/v1/datasets/mix", {"name": name, "sources": sources,
                                              "dedupe": dedupe, "seed": seed})

    def list_datasets(self, limit: int = 20, after: str | None = None) -> Json:
        return self.page("/v1/datasets", limit, after)

    def get_dataset(self, dataset_id: str) -> Json:
        """A dataset by id, or by name (names are unique per owner; your own first)."""
        return self._by_name("/v1/datasets", "ds_", dataset_id, "dataset")

    def _by_name(self, path: str, prefix: str, ref: str, what: str) -> Json:
        if ref.startswith(prefix):
            return self.get(f"{path}/{ref}")
        found = [x for x in self.iter_all(path) if x.get("name") == ref]
        mine = False
        if len(found) > 1:
            me = self.get("/v1/users/me").get("id")
            own = [x for x in found if x.get("owner") == me]
            mine, found = bool(own), own or found
        if len(found) == 1:
            return found[0]
        whose = "of yours" if mine else "of other users"
        raise NotFound(404, "not_found", (
            f"{len(found)} {what}s {whose} are named {ref!r} "
            f"({', '.join(x['id'] for x in found[:5])}); give the id" if found
            else f"no {what} has the id or name {ref!r}"), param="name")

    def delete_dataset(self, dataset_id: str) -> None:
        self.delete(f"/v1/datasets/{dataset_id}")

    def wait_dataset(self, dataset_id: str, timeout: float | None = 600,
                     poll: float = 0.3) -> Json:
        """Until the ingest ends: the dataset, `ready` or `failed`."""
        return self._wait(lambda: self.get_dataset(dataset_id),
                          lambda d: d["status"] != "ingesting", timeout, poll,
                          f"dataset {dataset_id}")

    # ---- plans and runs -------------------------------------------------------------
    def plan(self, body: Json, timeout: float = 180) -> Json:
        """Dry-run a run body: `{"ok", "checks", "estimates", "warnings", ...}`."""
        return self._check(self.http.post("/v1/plans", json=body, timeout=timeout))

    def create_run(self, body: Json, idempotency_key: str | None = None,
                   timeout: float = 180) -> Json:
        """Submit a whole run (the body of POST /v1/runs). A plan with errors is refused
        with `Unprocessable`/`Conflict` code `plan_failed`, the plan in `details`."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._check(self.http.post("/v1/runs", json=body, headers=headers,
                                          timeout=timeout))

    def list_runs(self, limit: int = 20, after: str | None = None) -> Json:
        return self.page("/v1/runs", limit, after)

    def get_run(self, run_id: str) -> Json:
        """A run by id, or by name (your own first; several of that name: give the id)."""
        return self._by_name("/v1/runs", "run_", run_id, "run")

    def run_report(self, run_id: str) -> Json:
        """The report people read: verdict, tau trained vs untrained, per-position
        acceptance, training curves, plots, serve command, lineage (app/runs/report.py)."""
        return self.get(f"/v1/runs/{run_id}/report")

    def cancel_run(self, run_id: str) -> Json:
        """Cancel every unfinished stage of a run (by id, or by name); the run as it is then."""
        if not run_id.startswith("run_"):
            run_id = self.get_run(run_id)["id"]
        return self.post(f"/v1/runs/{run_id}/cancel")

    def retry_run(self, run_id: str) -> Json:
        return self.post(f"/v1/runs/{run_id}/retry")

    def wait_run(self, run_id: str, timeout: float | None = None, poll: float = 1.0) -> Json:
        return self._wait(lambda: self.get_run(run_id), lambda r: r["status"] in TERMINAL,
                          timeout, poll, f"run {run_id}")

    # ---- jobs -----------------------------------------------------------------------
    def submit_job(self, type: str, params: dict | None = None, inputs: dict | None = None,  # noqa: A002
                   gpus: int = 0, priority: int = 50, name: str | None = None,
                   force: bool = False, idempotency_key: str | None = None) -> Json:
        body = {"type": type, "params": params or {}, "inputs": inputs or {}, "gpus": gpus,
                "priority": priority, "force": force}
        if name:
            body["name"] = name
        return self.post("/v1/jobs", body, idempotency_key)

    def list_jobs(self, status: str | None = None, type: str | None = None,  # noqa: A002
                  owner: str | None = None, run_id: str | None = None, limit: int = 20,
                  after: str | None = None) -> Json:
        return self.page("/v1/jobs", limit, after, status=status, type=type, owner=owner,
                         run_id=run_id)

    def get_job(self, job_id: str) -> Json:
        return self.get(f"/v1/jobs/{job_id}")

    def cancel_job(self, job_id: str) -> Json:
        return self.post(f"/v1/jobs/{job_id}/cancel")

    def retry_job(self, job_id: str) -> Json:
        return self.post(f"/v1/jobs/{job_id}/retry")

    def wait_job(self, job_id: str, timeout: float | None = None, poll: float = 0.5) -> Json:
        """Until the job is succeeded, failed or cancelled: its final object."""
        return self._wait(lambda: self.get_job(job_id), lambda j: j["status"] in TERMINAL,
                          timeout, poll, f"job {job_id}")

    def events(self, job_id: str, after_seq: int = 0, limit: int = 1000) -> list[Json]:
        return self.get(f"/v1/jobs/{job_id}/events", after_seq=after_seq, limit=limit)["data"]

    def follow_events(self, job_id: str, after_seq: int = 0) -> Iterator[Json]:
        """The job's events live (SSE) until it ends: `{"seq", "at", "kind", "data"}`."""
        with self.http.stream("GET", f"/v1/jobs/{job_id}/events", params={"after_seq": after_seq},
                              headers={"Accept": "text/event-stream"}, timeout=None) as r:
            if r.status_code >= 400:
                r.read()
                self._check(r)
            data: list[str] = []
            for line in r.iter_lines():
                if line.startswith("data:"):
                    data.append(line[5:].lstrip())
                elif not line and data:
                    yield json.loads("\n".join(data))
                    data = []

    def logs(self, job_id: str, tail: int | None = None) -> str:
        return self.get(f"/v1/jobs/{job_id}/logs", tail=tail)

    def follow_logs(self, job_id: str, tail: int | None = None) -> Iterator[str]:
        """The job's log as it grows, in chunks of text, until the job ends."""
        params: dict[str, str | int] = {"follow": "true", **({"tail": tail} if tail else {})}
        with self.http.stream("GET", f"/v1/jobs/{job_id}/logs", params=params,
                              timeout=None) as r:
            if r.status_code >= 400:
                r.read()
                self._check(r)
            yield from r.iter_text()

    def metrics(self, job_id: str) -> dict[str, list[list[float]]]:
        """Time series `{"loss": [[step, value], ...], ...}`."""
        return self.get(f"/v1/jobs/{job_id}/metrics")

    # ---- artifacts ------------------------------------------------------------------
    def list_artifacts(self, kind: str | None = None, job_id: str | None = None,
                       limit: int = 20, after: str | None = None) -> Json:
        return self.page("/v1/artifacts", limit, after, kind=kind, job_id=job_id)

    def get_artifact(self, artifact_id: str) -> Json:
        return self.get(f"/v1/artifacts/{artifact_id}")

    def delete_artifact(self, artifact_id: str) -> Json:
        """Files removed, the row kept as a tombstone; 409 (`Conflict`) while in use."""
        return self.delete(f"/v1/artifacts/{artifact_id}")

    # ---- storage --------------------------------------------------------------------
    def storage(self) -> Json:
        """Bytes by kind, owner and run; volumes; reclaimable bytes (GET /v1/storage)."""
        return self.get("/v1/storage")

    def prune_storage(self, dry_run: bool = True) -> Json:
        """What retention removes now (`dry_run`: only list it)."""
        return self.post("/v1/storage/prune", {"dry_run": dry_run})

    def download_file(self, artifact_id: str, path: str, dest: str | Path,
                      progress: Progress | None = None) -> Path:
        """One file of an artifact to `dest`, written whole or not at all."""
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(dest.name + ".part")
        with self.http.stream("GET", f"/v1/artifacts/{artifact_id}/files/{path}",
                              timeout=None) as r:
            if r.status_code >= 400:
                r.read()
                self._check(r)
            total = int(r.headers["content-length"]) if "content-length" in r.headers else None
            with open(part, "wb") as fh:
                for chunk in r.iter_bytes(1 << 20):
                    fh.write(chunk)
                    if progress:
                        progress(r.num_bytes_downloaded, total)
        os.replace(part, dest)
        return dest

    def pull_artifact(self, artifact_id: str, dest_dir: str | Path,
                      progress: Progress | None = None) -> Path:
        """Every file of an artifact (a drafter folder: config, weights) into `dest_dir`,
        checked against the sha256 the server recorded; `progress(bytes, total)` overall."""
        art = self.get_artifact(artifact_id)
        dest_dir = Path(dest_dir)
        total = sum(f.get("bytes") or 0 for f in art["files"])
        done = 0
        for f in art["files"]:
            target = dest_dir / f["path"]
            if not target.resolve().is_relative_to(dest_dir.resolve()):
                raise ValueError(f"artifact {artifact_id} names a file outside its folder: "
                                 f"{f['path']!r}")
            step = None
            if progress is not None:
                report, base = progress, done

                def step(n: int, _t: int | None, report=report, base=base) -> None:
                    report(base + n, total)
            self.download_file(artifact_id, f["path"], target, step)
            done += f.get("bytes") or 0
            if f.get("sha256"):
                got = hashlib.sha256(target.read_bytes()).hexdigest()
                if got != f["sha256"]:
                    raise ApiError(200, "checksum_mismatch", f"{f['path']}: sha256 {got} but the "
                                   f"server recorded {f['sha256']}", "path")
        (dest_dir / "artifact.json").write_text(json.dumps(art, indent=1, default=str))
        return dest_dir

    # ---- queue and cluster ----------------------------------------------------------
    def queue(self) -> Json:
        return self.get("/v1/queue")

    def nodes(self) -> list[Json]:
        return self.get("/v1/nodes")["data"]

    # ---- users (admin) --------------------------------------------------------------
    def create_user(self, name: str, role: Literal["admin", "member"] = "member") -> Json:
        """Answers the user with its token, shown this once."""
        return self.post("/v1/users", {"name": name, "role": role})

    def list_users(self, limit: int = 100, after: str | None = None) -> Json:
        return self.page("/v1/users", limit, after)

    def create_token(self, user_id: str) -> Json:
        return self.post(f"/v1/users/{user_id}/tokens")

    def delete_token(self, token_id: str) -> None:
        self.delete(f"/v1/tokens/{token_id}")

    # ---- webhooks -------------------------------------------------------------------
    def create_webhook(self, url: str, events: list[str] | None = None) -> Json:
        """Answers the webhook with its signing secret, shown this once."""
        body: Json = {"url": url}
        if events:
            body["events"] = events
        return self.post("/v1/webhooks", body)

    def list_webhooks(self, limit: int = 20, after: str | None = None) -> Json:
        return self.page("/v1/webhooks", limit, after)

    def delete_webhook(self, webhook_id: str) -> None:
        self.delete(f"/v1/webhooks/{webhook_id}")

    def webhook_deliveries(self, webhook_id: str, limit: int = 20,
                           after: str | None = None) -> Json:
        return self.page(f"/v1/webhooks/{webhook_id}/deliveries", limit, after)
