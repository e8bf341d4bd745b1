"""Helpers for the generate-stage tests, and a fake `vllm serve` for the vLLM backend's
lifecycle tests on machines without a GPU.

Run as a script, this module is the fake server: it takes the same command line as
`vllm serve <model> --host H --port P ...` (the backend's own command builder makes it; only
the launcher differs), serves GET /health and POST /v1/completions the way vLLM does with
`return_token_ids`, and records what it saw. Its behaviour comes from the environment:

    FAKE_VLLM_RECORD      file: {"argv", "pid", "child_pid"} written at start
    FAKE_VLLM_REQUESTS    file: one JSON line per completions payload received
    FAKE_VLLM_ANSWER      JSON list of token ids to answer (truncated to max_tokens)
    FAKE_VLLM_MODE        ok | fail500 | die_after_first | too_long:<n> | no_token_ids
    FAKE_VLLM_START_DELAY seconds during which /health answers 503
    FAKE_VLLM_REPLY_DELAY seconds to sleep before each completion reply
    FAKE_VLLM_IGNORE_TERM "1": ignore SIGTERM (the stop must escalate to SIGKILL)
    FAKE_VLLM_CHILD       "1": start a child process, as vLLM starts its engine processes
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve()


def fake_executable() -> list[str]:
    """The launcher of this fake instead of `vllm serve`."""
    return [sys.executable, str(HERE)]


def fake_vllm_setting() -> dict[str, str]:
    """The server setting (DRAFTYARD_VLLM_COMMAND) that makes the stage run this fake: which
    vLLM runs is the server's to say, never a job's."""
    import shlex

    return {"DRAFTYARD_VLLM_COMMAND": shlex.join(fake_executable())}


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return not pid_alive(pid)


def _arg(argv: list[str], name: str, default: str | None = None) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else default


def _serve() -> None:
    argv = sys.argv[1:]
    host, port = _arg(argv, "--host", "127.0.0.1"), int(_arg(argv, "--port"))
    served = _arg(argv, "--served-model-name", "model")
    mode = os.environ.get("FAKE_VLLM_MODE", "ok")
    answer = json.loads(os.environ.get("FAKE_VLLM_ANSWER", "[9707, 0, 151645]"))
    ready_at = time.monotonic() + float(os.environ.get("FAKE_VLLM_START_DELAY", "0"))
    reply_delay = float(os.environ.get("FAKE_VLLM_REPLY_DELAY", "0"))
    if os.environ.get("FAKE_VLLM_IGNORE_TERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = None
    if os.environ.get("FAKE_VLLM_CHILD") == "1":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    if os.environ.get("FAKE_VLLM_RECORD"):
        rec = Path(os.environ["FAKE_VLLM_RECORD"])
        tmp = rec.with_name(rec.name + ".tmp")  # renamed: a reader never sees half of it
        tmp.write_text(json.dumps(
            {"argv": argv, "pid": os.getpid(), "child_pid": child.pid if child else None}))
        os.replace(tmp, rec)
    req_log = os.environ.get("FAKE_VLLM_REQUESTS")
    lock = threading.Lock()
    served_count = [0]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):  # keep the server log small
            pass

        def _send(self, code: int, obj: dict) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                self._send(200 if time.monotonic() >= ready_at else 503, {})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self):
            if self.path != "/v1/completions":
                return self._send(404, {"error": "not found"})
            payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                served_count[0] += 1
                n = served_count[0]
                if req_log:
                    with open(req_log, "a") as fh:
                        fh.write(json.dumps(payload) + "\n")
            if reply_delay:
                time.sleep(reply_delay)
            if mode == "die_after_first" and n > 1:
                os._exit(3)
            if mode == "fail500":
                return self._send(500, {"error": "engine overloaded"})
            prompt = payload["prompt"]
            if mode.startswith("too_long:") and len(prompt) > int(mode.split(":")[1]):
                return self._send(400, {"error": {"message": "This model's maximum context "
                                                  "length is 64 tokens. However, you "
                                                  "requested more tokens."}})
            ids = answer[: payload["max_tokens"]]
            finish = "stop" if len(ids) == len(answer) else "length"
            choice = {"index": 0, "text": "(server text)", "finish_reason": finish,
                      "logprobs": None, "prompt_token_ids": prompt}
            if mode != "no_token_ids":
                choice["token_ids"] = ids
            self._send(200, {"id": f"cmpl-{n}", "object": "text_completion", "model": served,
                             "choices": [choice],
                             "usage": {"prompt_tokens": len(prompt),
                                       "completion_tokens": len(ids)}})

    httpd = ThreadingHTTPServer((host, port), Handler)
    httpd.daemon_threads = True
    httpd.serve_forever()


# ---- helpers for the tests (not used by the fake server) ----

def make_spec(root: Path, records: list[dict], target: dict, **params) -> dict:
    """A generate spec over `records` written as a dataset artifact under root."""
    from tests.stages.records_support import write_dataset

    root = Path(root)
    ds = root / "input"
    if not (ds / "data.parquet").exists():
        write_dataset(ds, records)
    return {"inputs": {"dataset": {"path": str(ds), "meta": {}}, "target": target},
            "params": {"backend": "hf", **params},
            "out_dir": str(root / "out"), "work_dir": str(root / "work"),
            "events_path": str(root / "events.jsonl")}


def run_stage(spec: dict) -> dict:
    from tests.stages.typed import run_stage as run_typed
    from workers.stages.common import StageContext

    ctx = StageContext.from_spec(spec)
    try:
        return run_typed("generate", spec, ctx)
    finally:
        ctx.close()


def read_output(spec: dict) -> tuple[dict, dict, list[dict], dict]:
    """(records by id, token rows by (id, turn), failures, meta) of a finished run."""
    import pyarrow.parquet as pq

    from workers.stages.records import iter_records

    folder = Path(spec["out_dir"]) / "dataset"
    recs = {r["id"]: r for r in iter_records(folder)}
    toks = {(t["id"], t["turn"]): t
            for t in pq.read_table(folder / "token_ids.parquet").to_pylist()}
    fails = [json.loads(line) for line in (folder / "failures.jsonl").read_text().splitlines()]
    meta = json.loads((folder / "meta.json").read_text())
    return recs, toks, fails, meta


def events(spec: dict) -> list[dict]:
    p = Path(spec["events_path"])
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


if __name__ == "__main__":
    _serve()
