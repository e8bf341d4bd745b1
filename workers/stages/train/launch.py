"""Processes around training: the device plan over the leased GPUs, the torchrun re-launch
for multi-GPU (the stage process stays the parent: it owns the vLLM server in online mode,
forwards a stop, and turns the ranks' outcome into the stage's result), and the vLLM
hidden-states server for online mode.

Worker entry point (what torchrun runs on each rank):
    python -m workers.stages.train.launch --spec <work_dir>/launch/worker.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

from procgroup import bind_to_parent, spawn, stop_group
from workers.stages.common import StageContext, StageError, write_json_atomic
from workers.stages.vllm_server import option_flags, serve_command

LAUNCH_DIR = "launch"
STOP_GRACE_S = 120.0   # a rank finishes its step and writes a checkpoint within this


@dataclass
class DevicePlan:
    device: str                                      # "cuda" | "cpu"
    nproc: int                                       # training processes
    train_gpus: list[str] = field(default_factory=list)   # CUDA_VISIBLE_DEVICES entries
    vllm_gpus: list[str] = field(default_factory=list)


def visible_gpu_ids(count: int) -> list[str]:
    """The leased GPUs as this process sees them (the supervisor sets CUDA_VISIBLE_DEVICES)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [x.strip() for x in env.split(",") if x.strip()] if env else []
    return ids[:count] if ids else [str(i) for i in range(count)]


def plan_devices(n_gpus: int, nproc: int | None, source: str, vllm_gpus: int) -> DevicePlan:
    """Split the visible GPUs: vLLM (online) takes the first `vllm_gpus`, training the rest,
    one process per GPU unless `nproc` says fewer. Without GPUs, `nproc` CPU processes."""
    if n_gpus == 0:
        if source == "vllm":
            raise StageError("backend_unavailable", "online mode with vLLM needs GPUs")
        return DevicePlan("cpu", nproc or 1)
    ids = visible_gpu_ids(n_gpus)
    served: list[str] = []
    if source == "vllm":
        if n_gpus < vllm_gpus + 1:
            raise StageError("insufficient_gpus", f"online mode needs online.vllm_gpus "
                             f"({vllm_gpus}) GPUs for vLLM plus at least one for training; "
                             f"{n_gpus} leased", details={"gpus": n_gpus})
        served, ids = ids[:vllm_gpus], ids[vllm_gpus:]
    n = nproc or len(ids)
    if n > len(ids):
        raise StageError("invalid_params", f"nproc={n} exceeds the {len(ids)} GPU(s) left for "
                         "training", details={"field": "nproc"})
    return DevicePlan("cuda", n, ids[:n], served)


def torchrun_command(nproc: int, worker_spec: Path) -> list[str]:
    """torchrun on this host: --standalone picks a free rendezvous port, so concurrent jobs
    on one box do not collide; no restarts (a retry is the job system's decision)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(nproc), "--max-restarts", "0",
            "-m", "workers.stages.train.launch", "--spec", str(worker_spec)]


def worker_env(plan: DevicePlan) -> dict[str, str]:
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(x for x in (repo, env.get("PYTHONPATH")) if x)
    if plan.device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(plan.train_gpus)
    else:
        # CPU ranks share the cores: one thread each keeps them from oversubscribing.
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_distributed(job_json: dict, plan: DevicePlan, work_dir: Path) -> dict:
    """Train under torchrun; returns rank 0's summary. A stop (KeyboardInterrupt here) is
    forwarded as SIGTERM, so the ranks checkpoint at their next step, then re-raised."""
    launch_dir = work_dir / LAUNCH_DIR
    launch_dir.mkdir(parents=True, exist_ok=True)
    for name in ("result.json", "error.json"):
        (launch_dir / name).unlink(missing_ok=True)
    spec = launch_dir / "worker.json"
    write_json_atomic(spec, job_json)
    cmd = torchrun_command(plan.nproc, spec)
    print(f"[train] launching: {' '.join(cmd)}", flush=True)
    # torchrun dies with this process even when it is SIGKILLed (and its ranks with it:
    # they arm their own death signal, see main); a stop is forwarded as SIGTERM below.
    proc = spawn(cmd, env=worker_env(plan), stdin=None, death_signal=signal.SIGKILL)
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        stop_group(proc, STOP_GRACE_S)
        raise
    error = launch_dir / "error.json"
    if error.is_file():
        e = json.loads(error.read_text())
        raise StageError(e["code"], e["message"], e.get("details"))
    result = launch_dir / "result.json"
    if rc != 0 or not result.is_file():
        raise RuntimeError(f"torchrun exited with status {rc} (see the log above)")
    return json.loads(result.read_text())


# --- online mode: the vLLM hidden-states server (its lifecycle: workers/stages/vllm_server.py)

def vllm_server_command(target_path: str, layer_ids: list[int], num_layers: int,
                        hs_dir: Path, port: int, tp: int, max_model_len: int,
                        gpu_memory_utilization: float, options: Any) -> list[str]:
    """vLLM serving the target with its hidden-state extractor (speculators' launch_vllm.py
    recipe): the `extract_hidden_states` speculative method taps the aux layers plus layer
    N, and the file connector writes each request's states where the trainer reads them."""
    speculative = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                   "draft_model_config": {"hf_config": {
                       "eagle_aux_hidden_state_layer_ids": [*layer_ids, num_layers]}}}
    kv_transfer = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                   "kv_connector_extra_config": {"shared_storage_path": str(hs_dir)}}
    return [*serve_command(target_path, port=port),
            "--speculative-config", json.dumps(speculative),
            "--kv-transfer-config", json.dumps(kv_transfer),
            "--tensor-parallel-size", str(tp), "--max-model-len", str(max_model_len),
            "--gpu-memory-utilization", str(gpu_memory_utilization), *option_flags(options)]


# --- worker entry point -----------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """One torchrun rank: train, then rank 0 reports through result.json/error.json (the
    stage process declares the artifact and the result)."""
    ap = argparse.ArgumentParser(prog="python -m workers.stages.train.launch")
    ap.add_argument("--spec", required=True)
    args = ap.parse_args(argv)
    # torchrun starts each rank in a session of its own: nothing but this reaches the rank
    # when torchrun is SIGKILLed, and a rank must not train on as an orphan.
    bind_to_parent(signal.SIGKILL)
    from workers.stages.train.job import TrainJob
    from workers.stages.train.loop import train

    job = TrainJob.from_json(json.loads(Path(args.spec).read_text()))
    rank = int(os.environ.get("RANK", "0"))
    # Only rank 0 writes job events; the other ranks' reports would duplicate them.
    ctx = StageContext(events_path=Path(job.events_path) if rank == 0 and job.events_path
                       else None, out_dir=Path(job.out_dir), work_dir=Path(job.work_dir))
    launch_dir = Path(job.work_dir) / LAUNCH_DIR
    try:
        train(job, ctx)
        return 0
    except StageError as e:
        if rank == 0:
            write_json_atomic(launch_dir / "error.json",
                              {"code": e.code, "message": e.message, "details": e.details})
        print(f"error [{e.code}]: {e.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"rank {rank} stopped", file=sys.stderr)
        return 130
    finally:
        ctx.close()


if __name__ == "__main__":
    sys.exit(main())
