"""The transformers backend: length-sorted batches, only the wanted layers kept.

The decoder (the model without its LM head) is run directly, so no vocabulary-sized logits
are computed. Forward pre-hooks on the wanted decoder layers and on the final norm copy the
residual stream entering them into one preallocated [B, T, L, H] buffer in the storage
dtype: the other layers' activations are never kept, and pre-hooks read exactly what HF's
`output_hidden_states[i]` reports (the input of layer i) without depending on what a
decoder layer returns. Padding is cut off before a sample is written.

With several devices (GPUs), one process per device takes a balanced share of the batches;
every process writes its own samples, so no coordination is needed beyond the file names.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from workers.stages.common import StageError
from workers.stages.cpu import cpu_compute_dtype
from workers.stages.extract.backends import ExtractJob, Progress, open_rows, read_input_ids
from workers.stages.extract.batching import Batch, plan_batches, shard_batches
from workers.stages.extract.layers import LayerPlan
from workers.stages.extract.writer import AsyncWriter, samples, torch_dtype


def load_decoder(job: ExtractJob, device: str) -> tuple[Any, Any]:
    """(model, decoder) on device in eval mode, checked against the layer plan."""
    import torch
    from transformers import AutoModelForCausalLM

    # The forward's dtype: the stored one, except float32 on a CPU without native support for
    # it (workers/stages/cpu.py); the capture buffer casts to the stored dtype either way.
    compute = cpu_compute_dtype(job.dtype) if device == "cpu" else job.dtype
    kw: dict[str, Any] = {"dtype": torch_dtype(compute)}
    if job.attn_implementation:
        kw["attn_implementation"] = job.attn_implementation
    if device != "cpu":
        kw["device_map"] = device  # load straight onto the GPU, not through host memory
    model = AutoModelForCausalLM.from_pretrained(job.target.path, **kw)
    model.to(torch.device(device)).eval()
    decoder = model.get_decoder()
    layers = getattr(decoder, "layers", None)
    if layers is None or getattr(decoder, "norm", None) is None:
        raise StageError("unsupported_target", f"{type(decoder).__name__} has no `layers` and "
                         f"`norm`: the hf backend cannot tap its hidden states")
    if len(layers) != job.layers.num_target_layers:
        raise StageError("invalid_input", f"target has {len(layers)} decoder layers but its "
                         f"config says {job.layers.num_target_layers}")
    return model, decoder


class LayerCapture:
    """Pre-hooks that copy the hidden states entering the wanted layers into `buf`.

    Slot j < len(aux) holds the input of decoder layer aux[j] (= HF hidden_states[aux[j]]);
    the last slot holds the input of the final norm (layer N before the norm).
    """

    def __init__(self, decoder: Any, plan: LayerPlan, dtype: Any):
        self.plan = plan
        self.dtype = dtype
        self.buf: Any = None
        modules = [decoder.layers[i] for i in plan.aux] + [decoder.norm]
        self._handles = [m.register_forward_pre_hook(partial(self._hook, slot), with_kwargs=True)
                         for slot, m in enumerate(modules)]

    def _hook(self, slot: int, module: Any, args: tuple, kwargs: dict) -> None:
        h = args[0] if args else kwargs["hidden_states"]  # [B, T, H]
        self.buf[:, :, slot].copy_(h)                     # into [B, T, L, H] at slot

    def start(self, batch: int, seq: int, device: Any) -> Any:
        import torch

        self.buf = torch.empty(batch, seq, self.plan.num_stored, self.plan.hidden_size,
                               dtype=self.dtype, device=device)
        return self.buf

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def batch_inputs(batch: Batch, rows: list[Any], device: Any) -> dict[str, Any]:
    """Model inputs for one batch. rows: int64 numpy arrays in batch order."""
    import torch

    if batch.packed:
        ids = torch.from_numpy(_concat(rows))[None]                               # [1, T]
        pos = torch.cat([torch.arange(n) for n in batch.lengths])[None]           # [1, T]
        # No attention mask: transformers derives the block-diagonal causal mask from the
        # restarting position ids (needs use_cache=False, i.e. no past key values).
        return {"input_ids": ids.to(device), "position_ids": pos.to(device)}
    b, t = len(rows), max(batch.lengths)
    ids = torch.zeros(b, t, dtype=torch.long)                                     # [B, T]
    mask = torch.zeros(b, t, dtype=torch.long)                                    # [B, T]
    for r, row in enumerate(rows):
        ids[r, :len(row)] = torch.from_numpy(row)
        mask[r, :len(row)] = 1
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


def _concat(rows: list[Any]) -> Any:
    import numpy as np

    return np.concatenate(rows)


def split_samples(batch: Batch, buf_cpu: Any) -> list[Any]:
    """Per-sample [seq, L, H] views of a [B, T, L, H] buffer, padding cut off."""
    if batch.packed:
        out, off = [], 0
        for n in batch.lengths:
            out.append(buf_cpu[0, off:off + n])
            off += n
        return out
    return [buf_cpu[r, :n] for r, n in enumerate(batch.lengths)]


class HFExtractor:
    """A loaded target with its capture hooks, ready to extract batches on one device."""

    def __init__(self, job: ExtractJob, device: str):
        import torch

        self.job = job
        self.device = torch.device(device)
        self.model, self.decoder = load_decoder(job, device)
        self.capture = LayerCapture(self.decoder, job.layers, torch_dtype(job.dtype))
        self.ds = open_rows(job.tokenized_path)

    def run(self, batches: list[Batch], writer: AsyncWriter,
            progress: Progress | None = None) -> dict[str, float]:
        """Forward every batch and hand its samples to the writer (not drained here)."""
        import torch

        samples = tokens = 0
        forward_s = 0.0
        with torch.inference_mode():
            for batch in batches:
                rows = read_input_ids(self.ds, batch.indices)
                got = tuple(len(r) for r in rows)
                if got != batch.lengths:
                    raise StageError("invalid_input", f"rows {list(batch.indices)}: input_ids "
                                     f"lengths {list(got)} != seq_len {list(batch.lengths)}")
                inputs = batch_inputs(batch, rows, self.device)
                t0 = time.perf_counter()
                self.capture.start(inputs["input_ids"].shape[0], inputs["input_ids"].shape[1],
                                   self.device)
                self.decoder(**inputs, use_cache=False)
                buf_cpu = self.capture.buf.to("cpu")  # one transfer per batch
                self.capture.buf = None
                forward_s += time.perf_counter() - t0
                for idx, row, hs in zip(batch.indices, rows, split_samples(batch, buf_cpu)):
                    writer.submit(idx, hs, torch.from_numpy(row))
                samples += len(batch.indices)
                tokens += batch.tokens
                if progress is not None:
                    progress(samples, tokens)
        return {"samples": samples, "tokens": tokens, "forward_s": forward_s}

    def close(self) -> None:
        self.capture.remove()


def run_batches(job: ExtractJob, batches: list[Batch], device: str,
                progress: Progress | None = None) -> dict[str, float]:
    """Extract and write every sample of `batches` on one device."""
    ex = HFExtractor(job, device)
    writer = AsyncWriter(job.folder)
    try:
        stats = ex.run(batches, writer, progress)
        writer.drain()
    finally:
        ex.close()
        writer.close()
    return stats


def _worker_main(job: ExtractJob, batches: list[Batch], device: str) -> None:
    run_batches(job, batches, device)


def device_names(workers: int) -> list[str]:
    import torch

    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        if workers > n:
            raise StageError("invalid_params", f"workers={workers} but only {n} CUDA devices "
                             f"are visible", details={"field": "workers"})
        return [f"cuda:{i}" for i in range(workers)]
    return ["cpu"] * workers


def extract(job: ExtractJob, todo: list[tuple[int, int]], progress: Progress) -> dict:
    batches = plan_batches(todo, job.batch_tokens, job.batch_mode)
    devices = device_names(job.workers)
    if len(devices) == 1:
        stats = run_batches(job, batches, devices[0], progress)
    else:
        stats = _run_parallel(job, batches, devices, dict(todo), progress)
    stats["batches"] = len(batches)
    stats["compute_tokens"] = sum(b.compute_tokens for b in batches)
    return stats


def _run_parallel(job: ExtractJob, batches: list[Batch], devices: list[str],
                  lengths: dict[int, int], progress: Progress) -> dict:
    """One spawned process per device; progress is read off the files that appear."""
    import multiprocessing as mp

    before = set(samples(job.folder).done())
    ctx = mp.get_context("spawn")  # CUDA cannot be used in a forked child
    procs = [ctx.Process(target=_worker_main, args=(job, shard, dev), daemon=True)
             for shard, dev in zip(shard_batches(batches, len(devices)), devices)]
    t0 = time.perf_counter()
    try:
        for p in procs:
            p.start()
        while True:
            alive = any(p.is_alive() for p in procs)
            done = set(samples(job.folder).done()) - before
            progress(len(done), sum(lengths.get(i, 0) for i in done))
            failed = [(dev, p.exitcode) for p, dev in zip(procs, devices)
                      if p.exitcode not in (None, 0)]
            if failed:
                # One worker's failure ends the run; the files all workers finished stay
                # in the scratch folder for the retry.
                raise StageError("backend_failed", f"hf worker(s) failed (device, exit code): "
                                 f"{failed}; see the stage log")
            if not alive:
                break
            time.sleep(1.0)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(timeout=30)
    done = set(samples(job.folder).done()) - before
    return {"samples": len(done), "tokens": sum(lengths.get(i, 0) for i in done),
            "forward_s": time.perf_counter() - t0}


def pick_batch_mode(requested: str, attn_implementation: str | None, hybrid: bool) -> str:
    """padded or packed. Packed rows are refused for hybrid targets (the linear-attention
    state would run across samples) and chosen by `auto` only where the attention kernel
    handles varlen rows natively (flash-attention); with sdpa/eager a packed row pays a
    full T x T masked attention, while sorted padded rows waste little."""
    if requested == "packed":
        if hybrid:
            raise StageError("invalid_params", "batch_mode=packed needs a target whose every "
                             "layer is softmax attention; this one has linear-attention/SSM "
                             "layers (use padded or auto)", details={"field": "batch_mode"})
        return "packed"
    if requested == "padded":
        return "padded"
    flash = (attn_implementation or "").startswith("flash_attention")
    return "packed" if flash and not hybrid else "padded"

