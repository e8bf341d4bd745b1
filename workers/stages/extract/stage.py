"""The extract stage: plan, refuse early or resume, run a backend, publish the folder.

Order matters: everything up to the disk check only reads, so a refused run writes
nothing. Samples are written into `work_dir/hidden_states/`, a `kernel.ShardSet` (which
survives a retry of the same job: finished files are kept, temp files of a killed attempt
are dropped) and the finished folder is published as `out_dir/hidden_states/`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from contracts.extract import ExtractParams
from contracts.resolved import ExtractResolved, ResolvedArtifact, ResolvedTarget
from workers.stages.common import StageContext, StageError
from workers.stages.extract.backends import ExtractJob, get_backend
from workers.stages.extract.layers import LayerPlan, is_hybrid, resolve_layers
from workers.stages.extract.planner import check_disk, estimate_hidden_state_bytes
from workers.stages.extract.writer import folder_bytes, samples, scan_finished, write_sample
from workers.stages.kernel import publish, target_config

# Bumped when the files written for the same inputs and params change; a scratch folder of
# another version is not resumed.
EXTRACT_VERSION = 1
ARTIFACT_DIR = "hidden_states"


def _seq_lens(tokenized_path: str, max_samples: int | None) -> list[int]:
    from datasets import load_from_disk

    try:
        ds = load_from_disk(tokenized_path)
    except Exception as e:  # noqa: BLE001
        raise StageError("invalid_input", f"cannot open tokenized set {tokenized_path}: "
                         f"{type(e).__name__}: {e}") from None
    if "input_ids" not in ds.column_names:
        raise StageError("invalid_input", f"tokenized set {tokenized_path} has no input_ids "
                         f"column (columns: {ds.column_names})")
    n = len(ds) if max_samples is None else min(max_samples, len(ds))
    plain = ds.with_format(None)
    if "seq_len" in ds.column_names:
        return [int(x) for x in plain.select(range(n))["seq_len"]]
    return [len(r) for r in plain.select(range(n))["input_ids"]]


def _warn_compute_dtype(dtype: str, backend: str, ctx: StageContext) -> None:
    """Say when a CPU forward runs in float32 for a half-precision storage dtype (cpu.py)."""
    from workers.stages.cpu import float32_note

    note = float32_note(dtype) if backend == "hf" else None
    if note:
        ctx.warning(note, compute_dtype="float32")


def _choose_backend(p: ExtractParams) -> str:
    import torch

    from workers.stages.vllm_server import vllm_installed

    vllm_here = vllm_installed()
    if p.backend == "auto":
        return "vllm" if torch.cuda.is_available() and vllm_here else "hf"
    if p.backend == "vllm" and not vllm_here:
        raise StageError("backend_unavailable", "backend=vllm but vllm is not installed here "
                         "(install draftyard[gpu], point the server's DRAFTYARD_VLLM_COMMAND "
                         "at one, or use backend=hf)", details={"field": "backend"})
    if p.backend == "vllm":
        from workers.stages.extract.backends.vllm import refuse_cpu_build

        refuse_cpu_build(p.vllm)
    return p.backend


def _fingerprint(tok: ResolvedArtifact, target: ResolvedTarget, plan: LayerPlan,
                 dtype: str) -> dict[str, Any]:
    """What the files in the scratch folder depend on; a retry with another value starts
    over instead of mixing files of two configurations."""
    return {"stage_version": EXTRACT_VERSION, "tokenized_path": tok.path,
            "tokenized_meta": tok.meta, "target_path": target.path,
            "stored_layer_ids": list(plan.stored), "hidden_size": plan.hidden_size,
            "dtype": dtype}


def _same_device(a: Path, b: Path) -> bool:
    try:
        return os.stat(a).st_dev == os.stat(b).st_dev
    except OSError:
        return True


def run(p: ExtractParams, inputs: ExtractResolved, ctx: StageContext) -> dict:
    tok, target = inputs.tokenized, inputs.target
    config = target_config(target)
    plan = resolve_layers(config, p.drafter_type, p.layer_ids)
    lens = _seq_lens(tok.path, p.max_samples)
    lengths = dict(enumerate(lens))
    shards = samples(ctx.work_dir / ARTIFACT_DIR)
    folder = shards.folder
    fingerprint = _fingerprint(tok, target, plan, p.dtype)
    stale = shards.stale(fingerprint)

    # Read-only until the disk check: which finished samples can a retry keep?
    recovered = not stale and shards.recover(ctx.out_dir / ARTIFACT_DIR)
    good: set[int] = set()
    bad: dict[int, str] = {}
    if not stale:
        good, bad = scan_finished(folder, lengths, plan.num_stored, plan.hidden_size, p.dtype,
                                  delete_bad=False)
    todo = [(i, n) for i, n in lengths.items() if i not in good]
    todo_tokens = sum(n for _, n in todo)
    need = estimate_hidden_state_bytes(todo_tokens, plan.num_stored, plan.hidden_size,
                                       p.dtype, num_samples=len(todo))
    disk = check_disk(need, ctx.work_dir, p.disk_margin_bytes, p.free_bytes_override)
    if not _same_device(ctx.work_dir, ctx.out_dir):
        # The final rename becomes a copy across filesystems: all of it must fit there too.
        total = estimate_hidden_state_bytes(sum(lens), plan.num_stored, plan.hidden_size,
                                            p.dtype, num_samples=len(lens))
        check_disk(total, ctx.out_dir, p.disk_margin_bytes, p.free_bytes_override)

    backend = _choose_backend(p)
    from workers.stages.extract.backends.hf import pick_batch_mode

    batch_mode = pick_batch_mode(p.batch_mode, p.attn_implementation, is_hybrid(config)) \
        if backend == "hf" else "vllm"
    total_tokens = sum(lens)
    ctx.progress(len(good), len(lens), "samples", stage="extract", force=True)
    _warn_compute_dtype(p.dtype, backend, ctx)

    # From here on the stage writes.
    if stale:
        ctx.warning("scratch hidden states were made with other inputs or params; "
                    "starting over", previous=shards.previous())
    shards.open(fingerprint)
    for i in bad:
        shards.path(i).unlink(missing_ok=True)
    if bad:
        ctx.warning(f"redoing {len(bad)} unusable or unselected scratch file(s)",
                    examples={str(k): v for k, v in list(bad.items())[:5]})
    if good:
        ctx.warning(f"resuming: {len(good)} of {len(lens)} samples already extracted",
                    recovered_published_folder=recovered)

    stats = _extract(p, backend, batch_mode, tok, target, plan, folder, ctx, todo,
                     done0=len(good), tokens0=total_tokens - todo_tokens, total=len(lens),
                     total_tokens=total_tokens)

    have = set(shards.done())
    missing = sorted(set(lengths) - have)
    if missing:
        raise StageError("incomplete", f"{len(missing)} samples have no hidden states after "
                         f"the backend finished (first: {missing[:10]})")
    theoretical = estimate_hidden_state_bytes(total_tokens, plan.num_stored, plan.hidden_size,
                                              p.dtype)
    data_bytes, files = folder_bytes(folder)
    meta = {
        "layer_ids": list(plan.aux), "last_layer_id": plan.num_target_layers,
        "stored_layer_ids": list(plan.stored), "num_layers_stored": plan.num_stored,
        "num_target_layers": plan.num_target_layers, "hidden_size": plan.hidden_size,
        "dtype": p.dtype, "drafter_type": p.drafter_type, "num_samples": len(lens),
        "num_tokens": total_tokens, "bytes": data_bytes, "theoretical_min_bytes": theoretical,
        "target_path": target.path, "tokenized_artifact": tok.path,
        "file_pattern": "hs_{idx}.safetensors", "backend": backend, "batch_mode": batch_mode,
    }
    # On another filesystem publishing copies (its space was checked above).
    publish(ctx, folder, ARTIFACT_DIR, "hidden_states", meta)
    return {"samples": len(lens), "tokens": total_tokens, "resumed_samples": len(good),
            "extracted_samples": len(todo), "bytes": data_bytes,
            "theoretical_min_bytes": theoretical,
            "bytes_ratio": round(data_bytes / theoretical, 4) if theoretical else None,
            "planned_bytes": disk.bytes_needed, "free_bytes_at_start": disk.free_bytes,
            "tokens_per_s": stats.get("tokens_per_s"), "backend": backend,
            "batch_mode": batch_mode, "layer_ids": list(plan.aux)}


def _extract(p: ExtractParams, backend: str, batch_mode: str, tok: ResolvedArtifact,
             target: ResolvedTarget,
             plan: LayerPlan, folder: Path, ctx: StageContext, todo: list[tuple[int, int]],
             done0: int, tokens0: int, total: int, total_tokens: int) -> dict:
    # Empty rows need no forward (and a padded row of only padding has no defined output).
    empty = [i for i, n in todo if n == 0]
    if empty:
        import torch

        from workers.stages.extract.writer import torch_dtype

        for i in empty:
            write_sample(folder, i, torch.empty(0, plan.num_stored, plan.hidden_size,
                                                dtype=torch_dtype(p.dtype)),
                         torch.empty(0, dtype=torch.int64))
        done0 += len(empty)
    work = [(i, n) for i, n in todo if n > 0]
    if not work:
        return {"tokens_per_s": None}
    workers = p.workers
    if workers is None:
        import torch

        workers = max(1, torch.cuda.device_count()) if backend == "hf" else 1
    job = ExtractJob(tokenized_path=tok.path, target=target, layers=plan,
                     dtype=p.dtype, batch_tokens=p.batch_tokens, batch_mode=batch_mode,
                     attn_implementation=p.attn_implementation, folder=folder,
                     work_dir=ctx.work_dir, workers=workers, vllm=p.vllm)
    t0 = time.perf_counter()
    last_metric = [t0]

    def progress(samples: int, tokens: int) -> None:
        ctx.progress(done0 + samples, total, "samples", stage="extract")
        now = time.perf_counter()
        if now - last_metric[0] >= 5.0:
            last_metric[0] = now
            ctx.metric(done0 + samples, tokens_done=tokens0 + tokens,
                       tokens_total=total_tokens, tokens_per_s=tokens / max(now - t0, 1e-9))

    stats = get_backend(backend)(job, work, progress)
    elapsed = time.perf_counter() - t0
    stats["tokens_per_s"] = round(sum(n for _, n in work) / max(elapsed, 1e-9), 1)
    ctx.progress(total, total, "samples", stage="extract", force=True)
    return stats
