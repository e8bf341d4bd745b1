"""Process-level pieces of a training run: the distributed topology (torchrun env or a
single process), the stop request raised by SIGTERM/SIGINT, wrapping the model for
DDP/FSDP, and the collective checkpoint save.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from workers.stages.train import checkpoint

# What signal.signal() returns and takes back (typeshed names it only privately).
_SignalHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


@dataclass
class Topology:
    world: int = 1
    rank: int = 0
    local_rank: int = 0
    fsdp: bool = False

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()


def setup(fsdp: bool) -> tuple[Topology, torch.device]:
    """Join the torchrun group when launched by torchrun; pick the device."""
    cuda = torch.cuda.is_available()
    if "LOCAL_RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return Topology(), torch.device("cuda", 0) if cuda else torch.device("cpu")
    import torch.distributed as dist

    local = int(os.environ["LOCAL_RANK"])
    if cuda:
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        # nccl between GPUs; gloo makes the same DDP code run between CPU processes.
        dist.init_process_group("nccl" if cuda else "gloo",
                                device_id=torch.device("cuda", local) if cuda else None)
    topo = Topology(world=dist.get_world_size(), rank=dist.get_rank(), local_rank=local,
                    fsdp=fsdp)
    return topo, torch.device("cuda", local) if cuda else torch.device("cpu")


def teardown(topo: Topology) -> None:
    if topo.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class StopRequest:
    """SIGTERM/SIGINT set a flag that the loop checks between steps, so the step in flight
    completes and the checkpoint is consistent (an exception raised inside `opt.step()`
    would leave half the parameters updated). Under torchrun a process can get the signal
    twice (the supervisor's group kill and torchrun's forward): repeats within `grace_s`
    are the same request; a later one aborts at once."""

    def __init__(self, grace_s: float = 5.0):
        self.requested = False
        self.signum: int | None = None
        self._first = 0.0
        self._grace = grace_s
        self._previous: dict[int, _SignalHandler] = {}

    def _handle(self, signum, _frame) -> None:
        now = time.monotonic()
        if not self.requested:
            self.requested, self.signum, self._first = True, signum, now
        elif now - self._first > self._grace:
            raise KeyboardInterrupt(f"signal {signum} repeated: stopping without a checkpoint")

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)

    def agreed(self, topo: Topology, device: torch.device) -> bool:
        """True on every rank once any rank was asked to stop (all stop at the same step)."""
        if not topo.distributed:
            return self.requested
        import torch.distributed as dist

        flag = torch.tensor([1.0 if self.requested else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)


def wrap(model, topo: Topology, device: torch.device, param_dtype: torch.dtype):
    """DDP (default) or FSDP2 (speculators' `apply_fully_sharded`) around the raw model."""
    if not topo.distributed:
        return model
    if topo.fsdp:
        from speculators.train.distributed import apply_fully_sharded

        return apply_fully_sharded(model, param_dtype=param_dtype)
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def _full_states(model, raw_model, optimizers, topo: Topology) -> tuple[dict, list[dict]]:
    if topo.fsdp:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return (get_model_state_dict(model, options=opts),
                [get_optimizer_state_dict(model, optimizers, options=opts)])
    return ({k: v.detach().cpu() for k, v in raw_model.state_dict().items()},
            [o.state_dict() for o in optimizers])


def save(work_dir: str | Path, step: int, model, raw_model, optimizers, schedulers,
         state: dict, topo: Topology) -> Path | None:
    """Write checkpoint step_<step>; collective (every rank calls it at the same step: FSDP
    gathers the full state, each rank writes its RNG)."""
    old = _block_stop_signals()
    try:
        if topo.is_main:
            checkpoint.tmp_dir(work_dir, step)
        topo.barrier()
        checkpoint.write_rng(checkpoint.tmp_dir(work_dir, step), topo.rank)
        model_state, optim_states = _full_states(model, raw_model, optimizers, topo)
        path = None
        if topo.is_main:
            path = checkpoint.finalize(
                work_dir, step, raw_model, model_state, optim_states,
                [s.state_dict() for s in schedulers], {**state, "fsdp": topo.fsdp,
                                                        "world": topo.world})
        topo.barrier()
        return path
    finally:
        _restore_signals(old)


def _block_stop_signals():
    """Hold SIGTERM/SIGINT while a checkpoint is written; they are delivered afterwards."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})


def _restore_signals(old) -> None:
    if old is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def load_optim_states(model, optimizers, schedulers, ckpt: Path, topo: Topology) -> None:
    optim, sched = checkpoint.load_optim(ckpt)
    if topo.fsdp:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        set_optimizer_state_dict(model, optimizers, optim[0], options=StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=True))
    else:
        for opt, sd in zip(optimizers, optim, strict=True):
            opt.load_state_dict(sd)
    for s, sd in zip(schedulers, sched, strict=True):
        s.load_state_dict(sd)
        # As speculators' checkpointer: put the scheduled lr back into the param groups.
        for group, lr in zip(s.optimizer.param_groups, s.get_last_lr(), strict=True):
            group["lr"] = lr
