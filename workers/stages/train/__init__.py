"""Stage `train`: target + tokenized set (+ hidden states) -> a speculators drafter.

    inputs:  tokenized {"path", "meta"}      the prepare stage's artifact (+ token_freq.pt)
             target    {resolved target}
             hidden_states {"path", "meta"}   offline mode only (the extract stage's artifact)
    params:  `params.TrainParams` (mode, drafter{type, num_layers, block_size, num_anchors,
             ttt_steps, target_layer_ids, draft_vocab_size, mask_token_id}, seq_length, lr,
             schedule, warmup_steps, epochs, max_steps, loss, position_weighting, optimizer,
             weight_decay, checkpoint_every, eval_every, val_fraction, seed, distributed,
             attention, log_every, nproc, num_workers, online{...})
    output:  artifact `drafter` (kind drafter) = out_dir/drafter: config.json with
             `speculators_config` + model.safetensors, loadable by
             `SpeculatorModel.from_pretrained`; meta carries the `vllm serve` command.
    scratch: work_dir/checkpoints/step_N (resume), work_dir/tb (TensorBoard),
             work_dir/launch (torchrun hand-off), work_dir/vllm.log (online mode).

Training resumes from the newest checkpoint in work_dir; SIGTERM checkpoints at the next
step boundary and exits 130. More than one visible GPU (or `nproc` > 1) re-launches the
training under torchrun (DDP, or FSDP with distributed=fsdp); online mode runs a vLLM
hidden-states server on the first `online.vllm_gpus` GPUs (or, without GPUs/vLLM, computes
hidden states with the HF target in-process).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from importlib.util import find_spec
from pathlib import Path

from contracts.drafters import drafter as drafter_def
from contracts.resolved import TrainResolved
from contracts.train import TrainParams
from procgroup import free_port
from workers.stages.common import StageContext, StageError

__all__ = ["run", "TrainParams"]


def _source(p: TrainParams, n_gpus: int, warn) -> str:
    """Where hidden states come from: offline files, the vLLM server, or the HF target."""
    if p.mode == "offline":
        return "offline"
    backend = p.online.backend
    has_vllm = find_spec("vllm") is not None
    if backend == "vllm":
        if not (n_gpus and has_vllm):
            raise StageError("backend_unavailable", "online.backend=vllm needs GPUs and the "
                             "vllm package", details={"gpus": n_gpus, "vllm": has_vllm})
        return "vllm"
    if backend == "auto" and n_gpus > p.online.vllm_gpus and has_vllm:
        return "vllm"
    if backend == "auto":
        warn("online mode without vLLM GPUs: hidden states come from the HF target "
             "in-process (slow on real targets)")
    return "hf"


def run(p: TrainParams, inputs: TrainResolved, ctx: StageContext) -> dict:
    import torch

    from workers.stages.train import build, launch, loop
    from workers.stages.train.job import resolve_job
    from workers.stages.vllm_server import VllmServer

    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    source = _source(p, n_gpus, ctx.warning)
    job = resolve_job(p, inputs, ctx, source, cuda=n_gpus > 0, warn=ctx.warning)
    plan = launch.plan_devices(n_gpus, p.nproc, source, p.online.vllm_gpus)
    if plan.nproc == 1 and p.distributed == "fsdp":
        ctx.warning("distributed=fsdp with one process: training without sharding")

    work_dir = Path(job.work_dir)
    server: AbstractContextManager[VllmServer | None] = nullcontext()
    if source == "vllm":
        port = p.online.port or free_port()
        cmd = launch.vllm_server_command(
            job.target_path, job.layer_ids, job.num_target_layers, work_dir / "online_hs",
            # vLLM sees whole rows (the trainer truncates them when packing).
            port, tp=len(plan.vllm_gpus), max_model_len=job.extra["longest_row"] + 1,
            gpu_memory_utilization=p.online.gpu_memory_utilization,
            options=p.online)
        server = VllmServer(cmd, port, work_dir / "vllm.log", gpus=plan.vllm_gpus,
                            pid_path=work_dir / "vllm.pid",
                            startup_timeout_s=p.online.startup_timeout_s, stop_grace_s=60.0,
                            port_param="params.online.port")
    with server as srv:
        if srv is not None:
            job.vllm_endpoint = srv.endpoint
        if plan.nproc > 1:
            result = launch.run_distributed(job.to_json(), plan, work_dir)
        else:
            result = loop.train(job, ctx)

    drafter = Path(job.out_dir) / loop.DRAFTER_DIR
    spec_cfg = build.vllm_speculative_config(drafter)
    if drafter_def(p.drafter.type).target_mtp:
        build.write_served_target(job.target_path, drafter)
    meta = {
        "type": p.drafter.type, "target_path": job.target_path,
        # The artifact is moved after the stage ends: substitute its final path.
        "vllm_serve_command": build.vllm_serve_command(job.target_path, "<drafter_path>",
                                                       spec_cfg, p.drafter.type),
        "vllm_speculative_config": spec_cfg,
        "steps": result["steps"], "initial_loss": result["initial_loss"],
        "final_loss": result["final_loss"], "layer_ids": job.layer_ids,
        "draft_vocab_size": job.draft_vocab_size, "seq_length": p.seq_length,
        "num_layers": p.drafter.num_layers, "mask_token_id": job.mask_token_id,
        "hidden_states_source": source, "val": result.get("val"),
    }
    ctx.artifact("drafter", "drafter", drafter, meta)
    return {k: result.get(k) for k in ("steps", "total_steps", "initial_loss", "final_loss",
                                       "tokens", "tokens_per_s", "step_time_s",
                                       "resumed_from_step", "val")} | {
        "type": p.drafter.type, "processes": plan.nproc, "device": plan.device,
        "hidden_states_source": source}
