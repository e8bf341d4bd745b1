"""The training loop, driven here rather than by speculators' `Trainer` (which assumes a GPU:
`.to(0)`, `torch.accelerator.synchronize()`, docs/FIELD-NOTES.md), around its model classes, losses,
optimizers, data pipeline and checkpoint format. One code path for CPU, one GPU, and torchrun
DDP/FSDP ranks.

A step is what speculators' trainer does: forward (loss + metrics) under bf16 autocast on
CUDA / float32 on CPU, backward, clip at 1.0, every optimizer (Muon + AdamW) and scheduler.
Resume restores weights, optimizer, scheduler, RNG and the data position (epoch, batch), so a
resumed CPU run continues exactly where the interrupted one was.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workers.stages.common import StageError, write_json_atomic
from workers.stages.train import build, checkpoint, data, heads, metrics, runtime
from workers.stages.train.job import TrainJob

GRAD_CLIP = 1.0            # speculators' trainer clips every step at 1.0
VAL_SEED_OFFSET = 7919     # eval draws its own anchors, leaving the training RNG untouched
DRAFTER_DIR = "drafter"


def _scheduler(opt, schedule: str, warmup: int, total: int):
    from transformers import (
        get_constant_schedule_with_warmup,
        get_cosine_schedule_with_warmup,
        get_linear_schedule_with_warmup,
    )

    if schedule == "cosine":
        return get_cosine_schedule_with_warmup(opt, warmup, max(total, 1))
    if schedule == "linear":
        return get_linear_schedule_with_warmup(opt, warmup, max(total, 1))
    return get_constant_schedule_with_warmup(opt, warmup)


def _optimizers(raw_model, p):
    """speculators' `build_optimizers`: Muon for 2D hidden matrices + AdamW for the rest."""
    from speculators.train.optimizers import build_optimizers
    from speculators.train.trainer import TrainerConfig

    cfg = TrainerConfig(lr=p.lr, num_epochs=p.epochs, save_path="", optimizer=p.optimizer,
                        weight_decay=p.weight_decay, muon_lr=p.lr)
    return build_optimizers(raw_model, cfg)


def _find_checkpoint(job: TrainJob, warn) -> tuple[Path | None, dict | None]:
    """Newest loadable checkpoint of this same training config, or (None, None)."""
    want = job.p.fingerprint()
    for ckpt in checkpoint.candidates(job.work_dir):
        try:
            state = checkpoint.read_state(ckpt)
        except (OSError, ValueError) as e:
            warn(f"checkpoint {ckpt.name} is unreadable ({e}); trying an older one")
            continue
        have = state.get("fingerprint")
        if have != want:
            diff = sorted(k for k in set(want) | set(have or {})
                          if (have or {}).get(k) != want.get(k))
            raise StageError("checkpoint_mismatch", f"work_dir holds a checkpoint of a "
                             f"different training config (differs in {diff}); only epochs, "
                             "max_steps and logging/checkpoint cadence may change on resume",
                             details={"checkpoint": str(ckpt), "fields": diff})
        return ckpt, state
    return None, None


def _seed(seed: int, rank: int) -> None:
    # Ranks share the init (same seed) but draw different DFlash anchors afterwards.
    random.seed(seed + rank)
    np.random.seed(seed + rank)  # speculators' samplers use numpy's global RNG
    torch.manual_seed(seed)


class Run:
    """One training process (a torchrun rank, or the whole run on one device)."""

    def __init__(self, job: TrainJob, ctx, topo: runtime.Topology, device: torch.device):
        self.job, self.ctx, self.topo, self.device = job, ctx, topo, device
        self.p = job.p
        self.cuda = device.type == "cuda"
        # CUDA: fp32 master weights under bf16 autocast with bf16 hidden states (as
        # speculators' trainer); CPU: float32 throughout (bf16 hidden states hit a dtype
        # mismatch in the matmul, docs/FIELD-NOTES.md).
        self.hs_dtype = torch.bfloat16 if self.cuda else torch.float32
        self.step_times: list[float] = []

    # --- setup -----------------------------------------------------------------------
    def setup(self) -> None:
        job, p, topo = self.job, self.p, self.topo
        if topo.is_main:
            checkpoint.clean_partial(job.work_dir)
        topo.barrier()
        self.ckpt, resumed = _find_checkpoint(job, self._warn)
        self.resumed: dict = resumed or {}  # the checkpoint's state ({} when none)
        _seed(p.seed, topo.rank)
        model = build.build_model(job)
        if self.ckpt is not None:
            checkpoint.load_model_weights(self.ckpt, model)
        if topo.is_main:  # the draft's logits must be the target's (train/heads.py)
            heads.check_drafter_heads(model, job.target_path, self._warn)
        self.raw = model.to(self.device)
        self.raw.train()
        self.model = runtime.wrap(self.raw, topo, self.device, self.hs_dtype)
        self.optimizers = _optimizers(self.raw, p)
        self.train_kwargs = build.trainer_kwargs(job, self.device.type)
        self.preprocess = build.preprocess_fn(job)

        self.train_ds = data.open_dataset(job, "train", self.hs_dtype, str(self.device))
        self.plan = data.batch_plan(self.train_ds, p.seq_length, topo.world, topo.rank, p.seed)
        per_epoch = len(self.plan.epoch(0))
        if per_epoch == 0:
            raise StageError("invalid_input", "the tokenized set packs into no training step "
                             f"on {topo.world} rank(s) at seq_length {p.seq_length}")
        self.total = p.epochs * per_epoch
        if p.max_steps is not None:
            self.total = min(self.total, p.max_steps)
        self.schedulers = [_scheduler(o, p.schedule, p.warmup_steps, self.total)
                           for o in self.optimizers]
        self.val_ds = self.val_plan = None
        if p.val_fraction > 0:
            self.val_ds = data.open_dataset(job, "val", self.hs_dtype, str(self.device))
            self.val_plan = data.batch_plan(self.val_ds, p.seq_length, topo.world, topo.rank,
                                            p.seed)

        self.state: dict[str, Any] = {"epoch": 0, "batch": 0, "step": 0, "initial_loss": None,
                                      "last_loss": None, "tokens": 0, "train_s": 0.0,
                                      "curve": [], "val": None}
        if self.ckpt is not None:
            runtime.load_optim_states(self.model, self.optimizers, self.schedulers, self.ckpt,
                                      topo)
            rng = checkpoint.load_rng(self.ckpt, topo.rank)
            if rng is not None:
                checkpoint.set_rng_state(rng)
            else:  # a checkpoint from fewer ranks: a fresh, distinct stream for this one
                torch.manual_seed(p.seed + 1009 * topo.rank + self.resumed["step"])
            self.state.update({k: self.resumed[k] for k in self.state if k in self.resumed})
            self._info(f"resuming from {self.ckpt.name} (step {self.state['step']}, epoch "
                       f"{self.state['epoch']}, batch {self.state['batch']})")
        self.start_step = self.state["step"]
        if self.ckpt is not None and self.resumed.get("world", 1) != topo.world:
            self._warn(f"resuming a {self.resumed.get('world', 1)}-process checkpoint on "
                       f"{topo.world}: the rest of this epoch is re-planned for the new shards")
        # Events the interrupted run logged after its checkpoint are dropped from TensorBoard.
        self.board = (metrics.Board(Path(job.work_dir) / "tb",
                                    purge_step=self.start_step + 1 if self.ckpt else None,
                                    run_id=job.extra.get("job_id"), config=job.params)
                      if topo.is_main else None)

    # --- reporting -------------------------------------------------------------------
    def _warn(self, message: str, **data_: Any) -> None:
        if self.topo.is_main:
            self.ctx.warning(message, **data_)

    def _info(self, message: str) -> None:
        if self.topo.is_main:
            print(f"[train] {message}", flush=True)

    def _log(self, window: metrics.Window, wall: float) -> float:
        values, tokens, errors = window.reduce(self.topo.distributed, self.topo.world)
        step = self.state["step"]
        out = {"loss": values["loss"], "lr": self.optimizers[0].param_groups[0]["lr"],
               "tokens_per_s": tokens / wall if wall > 0 else 0.0, "epoch": self.state["epoch"],
               **metrics.rename(values)}
        mem = metrics.gpu_mem_mib(self.device)
        if mem is not None:
            out["gpu_mem"] = mem
        if errors:
            self._warn(f"{errors} sample(s) had no usable hidden states in steps up to {step}",
                       step=step, dropped=errors)
        if self.topo.is_main:
            self.ctx.metric(step, **out)
        if self.board is not None:  # the main rank's
            self.board.log(step, out)
        self.state["curve"] = (self.state["curve"] + [[step, out["loss"]]])[-200:]
        return out["loss"]

    # --- one step --------------------------------------------------------------------
    def _to_device(self, batch: dict) -> tuple[dict, int, int]:
        from speculators.train.recovery import RECOVERY_METADATA_KEY

        meta = batch.pop(RECOVERY_METADATA_KEY, None)
        if meta is not None and meta.fatal:
            raise StageError("hidden_states_unavailable", f"hidden states could not be "
                             f"produced: {meta.error}")
        errors = int(batch.pop("error_records", 0))
        # document_ids is -1 on padding: real tokens packed into this step.
        tokens = int((batch["document_ids"] != -1).sum())
        moved = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()
                 if isinstance(v, torch.Tensor)}
        return moved, tokens, errors

    def _step(self, batch: dict):
        with torch.autocast(self.device.type, dtype=self.hs_dtype, enabled=self.cuda):
            _draft, loss, step_metrics = self.model(**batch, **self.train_kwargs)
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        for opt in self.optimizers:
            opt.step()
        for sched in self.schedulers:
            sched.step()
        return loss, step_metrics

    # --- evaluation --------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict[str, float] | None:
        if self.val_ds is None or self.val_plan is None:
            return None
        batches = self.val_plan.epoch(0)
        net = self.model if self.topo.fsdp else self.raw
        window = metrics.Window()
        self.raw.eval()
        devices = [self.device.index or 0] if self.cuda else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.p.seed + VAL_SEED_OFFSET)
            for batch in data.loader(self.val_ds, batches, self.job, self.hs_dtype, 0,
                                     self.cuda, self.preprocess):
                moved, tokens, errors = self._to_device(batch)
                with torch.autocast(self.device.type, dtype=self.hs_dtype, enabled=self.cuda):
                    _d, _loss, m = net(**moved, **self.train_kwargs)
                window.add(m, tokens, errors)
        self.raw.train()
        if window.steps == 0:
            return None
        values, _tok, _err = window.reduce(self.topo.distributed, self.topo.world)
        out = {"val_loss": values["loss"],
               **{f"val_{k}": v for k, v in metrics.rename(values).items()}}
        if self.topo.is_main:
            self.ctx.metric(self.state["step"], **out)
        if self.board is not None:
            self.board.log(self.state["step"], out, prefix="val")
        self.state["val"] = out
        return out

    # --- checkpoints -----------------------------------------------------------------
    def save(self) -> None:
        state = {**self.state, "fingerprint": self.p.fingerprint()}
        runtime.save(self.job.work_dir, self.state["step"], self.model, self.raw,
                     self.optimizers, self.schedulers, state, self.topo)
        self.saved_step = self.state["step"]

    def write_drafter(self) -> Path | None:
        """The output artifact: a speculators checkpoint in the target's dtype."""
        from speculators.train.checkpointer import patch_config_dtype

        full = None
        if self.topo.fsdp:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
            )

            full = get_model_state_dict(self.model, options=StateDictOptions(
                full_state_dict=True, cpu_offload=True))
        if not self.topo.is_main:
            return None
        dtype = getattr(torch, self.job.target_dtype, torch.float32)
        sd = full if full is not None else self.raw.state_dict()
        sd = {k: (v.detach().to("cpu", dtype) if v.is_floating_point() else v.detach().cpu())
              for k, v in sd.items()}
        out = Path(self.job.out_dir)
        tmp = out / f".{DRAFTER_DIR}.tmp"
        final = out / DRAFTER_DIR
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        self.raw.save_pretrained(tmp, state_dict=sd)
        patch_config_dtype(tmp / "config.json", dtype)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        return final

    # --- the loop ----------------------------------------------------------------------
    def train(self, stop: runtime.StopRequest, after_step=None) -> None:
        """`after_step(step)`: called between steps, outside the timed region (bench/train.py
        interleaves its bare baseline there)."""
        p, st = self.p, self.state
        self.saved_step = st["step"] if self.ckpt is not None else -1
        self._skip_empty_epochs()
        window, t_window = metrics.Window(), time.perf_counter()
        t_last = time.perf_counter()
        if st["step"] >= self.total or st["epoch"] >= p.epochs:
            return
        # One DataLoader for the rest of the run (workers start once, not per epoch).
        planned = data.PlannedBatches(self.plan, st["epoch"], st["batch"], p.epochs,
                                      self.total - st["step"])
        workers = self._workers()
        stream = data.loader(self.train_ds, planned, self.job, self.hs_dtype, workers,
                             self.cuda, self.preprocess)
        # Progress on every step, throttled by time only (StageContext.progress), never by
        # log_every: a train whose steps take a minute shows its rate and ETA from its first
        # step. This report is where the rate's clock starts (workers/supervisor.py _Rate).
        self.ctx.progress(st["step"], self.total, "steps", stage="train", force=True)
        first = True
        for batch in (stream if workers else data.prefetch(stream)):
            moved, tokens, errors = self._to_device(batch)
            _loss, step_metrics = self._step(moved)
            window.add(step_metrics, tokens, errors)
            st["step"] += 1
            st["batch"] += 1
            self._skip_empty_epochs()
            st["tokens"] += tokens * self.topo.world
            now = time.perf_counter()
            self.step_times.append(now - t_last)
            st["train_s"] += now - t_last
            t_last = now
            step = st["step"]
            if st["initial_loss"] is None or step % p.log_every == 0 or step == self.total:
                last = self._log(window, now - t_window)
                if st["initial_loss"] is None:
                    st["initial_loss"] = last   # the loss of step 1, before any update
                st["last_loss"] = last
                window, t_window = metrics.Window(), time.perf_counter()
            self.ctx.progress(step, self.total, "steps", stage="train", force=first)
            first = False
            if p.eval_every and step % p.eval_every == 0 and step < self.total:
                self.evaluate()
                t_last = time.perf_counter()
            if stop.agreed(self.topo, self.device):
                self._warn(f"stop requested: checkpoint at step {step}, then exit", step=step)
                self.save()
                raise KeyboardInterrupt(f"stopped at step {step} (checkpoint saved)")
            if step % p.checkpoint_every == 0 and step < self.total:
                self.save()   # its time counts in this step: part of the loop's cost
            if after_step is not None:
                after_step(step)
                t_last = time.perf_counter()
        if math.isnan(st["last_loss"] or 0.0):
            raise StageError("diverged", "training loss is NaN; lower lr or check the inputs")

    def _skip_empty_epochs(self) -> None:
        """Keep (epoch, batch) pointing at the next batch to train on."""
        st = self.state
        while st["epoch"] < self.p.epochs and st["batch"] >= len(self.plan.epoch(st["epoch"])):
            st["epoch"], st["batch"] = st["epoch"] + 1, 0

    def _workers(self) -> int:
        if self.p.num_workers is not None:
            return self.p.num_workers
        # HF-target hidden states load a model per worker: keep them in-process.
        return 4 if (self.cuda and self.job.source != "hf") else 0

    def summary(self) -> dict:
        st = self.state
        times = self.step_times[2:] or self.step_times
        return {
            "steps": st["step"], "total_steps": self.total, "epochs_done": st["epoch"],
            "resumed_from_step": self.start_step if self.ckpt is not None else None,
            "initial_loss": st["initial_loss"], "final_loss": st["last_loss"],
            "tokens": st["tokens"],
            "tokens_per_s": st["tokens"] / st["train_s"] if st["train_s"] > 0 else None,
            "step_time_s": statistics.median(times) if times else None,
            "val": st["val"],
        }


def train(job: TrainJob, ctx, after_step=None) -> dict:
    """Run (or resume, or just finish) training in this process; returns the summary.
    Rank 0 writes the drafter to out_dir/drafter and work_dir/launch/result.json."""
    p = job.p
    topo, device = runtime.setup(fsdp=p.distributed == "fsdp")
    try:
        run = Run(job, ctx, topo, device)
        run.setup()
        with runtime.StopRequest() as stop:
            # A stop request checkpoints at the next step boundary and raises
            # KeyboardInterrupt (exit 130, as the runner expects of a cancelled stage). A
            # KeyboardInterrupt from inside a step (a repeated signal) saves nothing: the
            # optimizer may be half-way through an update.
            run.train(stop, after_step)
            if p.val_fraction > 0:
                run.evaluate()
            if run.saved_step != run.state["step"]:
                run.save()
            run.write_drafter()
        summary = run.summary()
        if topo.is_main:
            write_json_atomic(Path(job.work_dir) / "launch" / "result.json",
                              {**summary, "step_times": run.step_times})
        if run.board is not None:
            run.board.close()
        return {**summary, "step_times": run.step_times}
    finally:
        runtime.teardown(topo)
