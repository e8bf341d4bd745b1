"""extract stage, vLLM backend without a GPU: the `vllm serve` command, the server's
lifetime, and the request/response loop against an HTTP transport that answers the way
vLLM's hidden-states connector does (hidden states computed by the real tiny target)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path

import pytest

from tests.stages.conftest import target_input
from tests.stages.test_extract_hf import assert_matches_reference, make_tokenized

torch = pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")


def _job(tmp: Path, model_dir: Path, tokd: Path, aux=(2, 4, 5), dtype="float32", **vllm):
    from contracts.extract import ExtractVllmParams
    from contracts.resolved import ResolvedTarget
    from workers.stages.extract.backends import ExtractJob
    from workers.stages.extract.layers import resolve_layers

    target = ResolvedTarget(**target_input(model_dir))
    plan = resolve_layers(target.config, "eagle3", list(aux))
    return ExtractJob(tokenized_path=str(tokd), target=target, layers=plan, dtype=dtype,
                      batch_tokens=1024, batch_mode="padded", attn_implementation=None,
                      folder=tmp / "hs", work_dir=tmp, workers=1,
                      vllm=ExtractVllmParams(**vllm))


def test_server_command_is_speculators_extraction_setup(tmp_path, tiny_target, monkeypatch):
    from workers.stages.common import StageError
    from workers.stages.extract.backends.vllm import server_command, visible_gpu_count

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6,7")
    assert visible_gpu_count() == 4
    job = _job(tmp_path, tiny_target, tmp_path, dtype="bfloat16", tensor_parallel_size=2,
               enforce_eager=True)
    cmd = server_command(job, 8123, tmp_path / "staging", 513, visible_gpu_count())
    assert cmd[1:5] == ["-m", "vllm.entrypoints.cli.main", "serve", str(tiny_target)]
    opt = {cmd[i]: cmd[i + 1] for i in range(5, len(cmd) - 1) if cmd[i].startswith("--")
           and not cmd[i + 1].startswith("--")}
    spec = json.loads(opt["--speculative-config"])
    assert spec["method"] == "extract_hidden_states" and spec["num_speculative_tokens"] == 1
    # aux layers, then the last layer N = 8 (the input of the final norm)
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == \
        [2, 4, 5, 8]
    kv = json.loads(opt["--kv-transfer-config"])
    assert kv == {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                  "kv_connector_extra_config": {"shared_storage_path":
                                                str(tmp_path / "staging")}}
    assert opt["--port"] == "8123" and opt["--dtype"] == "bfloat16"
    assert opt["--max-model-len"] == "513"
    assert opt["--tensor-parallel-size"] == "2" and opt["--data-parallel-size"] == "2"
    assert "--no-enable-prefix-caching" in cmd and cmd[-1] == "--enforce-eager"

    too_many = _job(tmp_path, tiny_target, tmp_path, tensor_parallel_size=2,
                    data_parallel_size=4)
    with pytest.raises(StageError) as e:
        server_command(too_many, 8123, tmp_path, 64, 4)
    assert "8" in e.value.message and "4 GPU" in e.value.message


def test_parse_completion_checks_what_vllm_saw():
    from workers.stages.extract.backends.vllm import (
        InvalidResponse,
        completion_request,
        parse_completion,
    )

    assert completion_request("m", [1, 2, 3]) == {"model": "m", "prompt": [1, 2, 3],
                                                  "max_tokens": 1, "return_token_ids": True}
    ok = {"choices": [{"prompt_token_ids": [1, 2, 3]}],
          "kv_transfer_params": {"hidden_states_path": "/s/a.safetensors"}}
    assert parse_completion(ok, [1, 2, 3]) == "/s/a.safetensors"
    assert parse_completion({**ok, "kv_transfer_params": {"handle": "h1"}}, [1, 2, 3]) == "h1"
    for bad, why in [({**ok, "choices": [{}]}, "prompt_token_ids"),
                     ({**ok, "choices": [{"prompt_token_ids": [1, 2]}]}, "differ"),
                     ({"choices": ok["choices"]}, "kv_transfer_params"),
                     ({**ok, "kv_transfer_params": {}}, "neither")]:
        with pytest.raises(InvalidResponse, match=why):
            parse_completion(bad, [1, 2, 3])


class FakeVllm:
    """Answers /v1/completions like `vllm serve` with the extract_hidden_states method and
    ExampleHiddenStatesConnector: runs the real target over the prompt and stages
    {hidden_states [seq, L, H] in the model dtype, token_ids} plus a `.lock` file."""

    def __init__(self, model_dir: Path, staging: Path, layer_ids: list[int],
                 fail_first: int = 0, corrupt: bool = False):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.staging = staging
        self.layer_ids = layer_ids
        self.fail_first = fail_first
        self.corrupt = corrupt
        self.requests: list[dict] = []
        staging.mkdir(parents=True, exist_ok=True)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        from safetensors.torch import save_file

        assert request.url.path == "/v1/completions"
        body = json.loads(request.content)
        self.requests.append(body)
        if len(self.requests) <= self.fail_first:
            return httpx.Response(503, text="engine busy")
        ids = body["prompt"]
        assert body["max_tokens"] == 1 and body["return_token_ids"] is True
        dec = self.model.get_decoder()
        cap = {}
        h = dec.norm.register_forward_pre_hook(lambda m, a: cap.setdefault("pre", a[0]))
        with torch.no_grad():
            out = dec(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
        h.remove()
        n = len(dec.layers)
        layers = [out.hidden_states[i][0] if i < n else cap["pre"][0] for i in self.layer_ids]
        path = self.staging / f"{uuid.uuid4().hex}.safetensors"
        save_file({"hidden_states": torch.stack(layers, dim=1).contiguous(),   # [seq, L, H]
                   "token_ids": torch.tensor(ids)}, str(path))
        Path(str(path) + ".lock").touch()
        echoed = ids[:-1] if self.corrupt else ids
        return httpx.Response(200, json={
            "id": "cmpl-1", "object": "text_completion", "model": body["model"],
            "choices": [{"index": 0, "text": "x", "finish_reason": "length",
                         "prompt_token_ids": echoed}],
            "kv_transfer_params": {"hidden_states_path": str(path)}})


def test_drive_writes_what_the_server_staged(tmp_path, tiny_target, datasets_dir):
    from workers.stages.extract.backends.vllm import drive

    tokd = tmp_path / "tok"
    rows = make_tokenized(tokd, tiny_target, datasets_dir, n=9)
    job = _job(tmp_path, tiny_target, tokd, concurrency=3, max_retries=2)
    fake = FakeVllm(tiny_target, tmp_path / "staging", [2, 4, 5, 8], fail_first=2)
    seen = []
    stats = asyncio.run(drive(job, "http://vllm.test", "draftyard-target",
                              [(i, len(r)) for i, r in enumerate(rows)],
                              lambda s, t: seen.append((s, t)),
                              transport=httpx.MockTransport(fake)))
    assert stats["samples"] == 9 and stats["tokens"] == sum(len(r) for r in rows)
    assert seen[-1] == (9, stats["tokens"])
    assert len(fake.requests) == 9 + 2  # two 503s retried
    assert sorted(r["prompt"] for r in fake.requests[2:]) == sorted(rows)
    assert list((tmp_path / "staging").iterdir()) == []  # staged files and locks consumed
    assert_matches_reference(tmp_path / "hs", tiny_target, rows, [2, 4, 5])


def test_drive_fails_fast_on_a_wrong_answer(tmp_path, tiny_target, datasets_dir):
    from workers.stages.common import StageError
    from workers.stages.extract.backends.vllm import drive

    tokd = tmp_path / "tok"
    rows = make_tokenized(tokd, tiny_target, datasets_dir, n=4)
    job = _job(tmp_path, tiny_target, tokd, concurrency=2, max_retries=3)
    fake = FakeVllm(tiny_target, tmp_path / "staging", [2, 4, 5, 8], corrupt=True)
    with pytest.raises(StageError) as e:
        asyncio.run(drive(job, "http://vllm.test", "m", [(i, len(r)) for i, r in enumerate(rows)],
                          lambda s, t: None, transport=httpx.MockTransport(fake)))
    assert e.value.code == "backend_failed" and "differ" in e.value.message
    assert len(fake.requests) <= 2  # not retried: the same request cannot get a better answer
    assert not (tmp_path / "hs").exists() or not list((tmp_path / "hs").iterdir())


FAKE_SERVER = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = {"/health": {}, "/v1/models": {"data": [{"id": "draftyard-target"}]}}.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write(json.dumps(body or {}).encode())
    def log_message(self, *a):
        pass
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_server_lifetime_ready_and_stopped(tmp_path):
    from procgroup import free_port
    from workers.stages.common import StageError
    from workers.stages.vllm_server import VllmServer

    port = free_port()
    srv = VllmServer([sys.executable, "-c", FAKE_SERVER, str(port)], port,
                     tmp_path / "server.log", startup_timeout_s=60)
    with srv:
        assert srv.alive()
        pid = srv.proc.pid
    assert srv.proc.poll() is not None  # the whole process group was stopped
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)

    dying = VllmServer([sys.executable, "-c", "print('CUDA out of memory'); raise SystemExit(3)"],
                       free_port(), tmp_path / "dying.log", startup_timeout_s=60)
    with pytest.raises(StageError) as e, dying:
        pass
    assert e.value.code == "backend_failed" and "CUDA out of memory" in e.value.message
