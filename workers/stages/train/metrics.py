"""Training metrics: speculators' per-step `<name>_sum` / `<name>_total` tensors summed over
a logging window (and across ranks), normalized with its `normalize_counted_metrics`, renamed
for job events, and mirrored to TensorBoard.

Event names: `loss` (mean per-step loss over the window), `lr`, `tokens_per_s` (all ranks),
`acc_<k>` = accuracy of the k-th drafted token under teacher forcing (DFlash: block position
k; EAGLE-3: `full_acc` of TTT step k-1, i.e. steps 1..k all correct), `cond_acc_<k>`
(EAGLE-3, given steps before k were right), `eal` (DFlash expected accepted length),
`gpu_mem` (MiB, peak since the last log) on CUDA.
"""

from __future__ import annotations

import os
import re
from importlib.util import find_spec
from pathlib import Path

import torch

_DFLASH_POS = re.compile(r"^position_(\d+)_acc$")
_EAGLE_FULL = re.compile(r"^full_acc_(\d+)$")
_EAGLE_COND = re.compile(r"^cond_acc_(\d+)$")


def rename(metrics: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in metrics.items():
        if m := _DFLASH_POS.match(k):
            out[f"acc_{int(m.group(1))}"] = v
        elif m := _EAGLE_FULL.match(k):
            out[f"acc_{int(m.group(1)) + 1}"] = v
        elif m := _EAGLE_COND.match(k):
            out[f"cond_acc_{int(m.group(1)) + 1}"] = v
        elif k in ("eal", "full_acc"):
            out[k] = v
    return out


class Window:
    """Sums of metric tensors over steps, kept on device to avoid a sync per step."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.steps = 0
        self.tokens = 0
        self.errors = 0

    def add(self, metrics: dict[str, torch.Tensor], tokens: int, errors: int) -> None:
        for k, v in metrics.items():
            v = v.detach().float().reshape(())
            self.sums[k] = v if k not in self.sums else self.sums[k] + v
        self.steps += 1
        self.tokens += tokens
        self.errors += errors

    def reduce(self, distributed: bool, world: int) -> tuple[dict[str, float], int, int]:
        """(normalized metrics, tokens over all ranks, dropped samples over all ranks)."""
        from speculators.train.utils import normalize_counted_metrics

        keys = sorted(self.sums)
        device = self.sums[keys[0]].device if keys else torch.device("cpu")
        vec = torch.stack([self.sums[k] for k in keys] +
                          [torch.tensor(float(self.tokens), device=device),
                           torch.tensor(float(self.errors), device=device)])
        if distributed:
            import torch.distributed as dist

            dist.all_reduce(vec, op=dist.ReduceOp.SUM)
        vals = vec.tolist()
        raw = dict(zip(keys, vals[:-2], strict=True))
        # Each rank counted one `loss_total` per step, so loss = sum over ranks and steps /
        # (world * steps): the mean per-step loss.
        out = normalize_counted_metrics(raw, world_size=1)
        return out, int(vals[-2]), int(vals[-1])


class Board:
    """TensorBoard event files in work_dir/tb (rank 0 only). On resume, events past the
    checkpoint's step (logged by the interrupted run) are purged so curves do not fork.
    Also W&B when configured (WANDB_PROJECT set and wandb installed), one run per job,
    resumed by id across retries."""

    def __init__(self, log_dir: Path, purge_step: int | None, run_id: str | None = None,
                 config: dict | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)
        self.wandb = None
        if os.environ.get("WANDB_PROJECT") and find_spec("wandb") is not None:
            import wandb

            self.wandb = wandb.init(project=os.environ["WANDB_PROJECT"], id=run_id,
                                    resume="allow", dir=str(log_dir), config=config or {})

    def log(self, step: int, values: dict[str, float], prefix: str = "train") -> None:
        for k, v in values.items():
            self.writer.add_scalar(f"{prefix}/{k}", v, step)
        self.writer.flush()
        if self.wandb is not None:
            self.wandb.log({f"{prefix}/{k}": v for k, v in values.items()}, step=step)

    def close(self) -> None:
        self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


def gpu_mem_mib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    peak = torch.cuda.max_memory_allocated(device) / (1 << 20)
    torch.cuda.reset_peak_memory_stats(device)
    return peak
