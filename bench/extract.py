"""Benchmark the extract stage on a tiny target (CPU).

Two measurements, each against a baseline taken in the same run:

1. throughput: tokens/s of the hf backend (forward with the layer-capture hooks, the copy
   off the device and the per-sample safetensors writes, drained) against a bare forward
   of an identical decoder without hooks, over the same length-sorted batches. The two are
   interleaved chunk by chunk, alternating which goes first, so load from other processes
   on a shared box hits both alike. Target: ratio >= 0.85.
2. storage: bytes of the published `hidden_states` folder written by the whole stage
   (`workers.stages.extract.run`) over the theoretical minimum (tokens x stored layers x
   hidden x dtype size + int64 token ids). Target: ratio <= 1.02.

    OMP_NUM_THREADS=1 python bench/extract.py [--quick] [--dtype float32|bfloat16]

Prints a table, then as the last line a JSON list of {"bench", "metric", "value",
"baseline", "ratio", "target", "pass"}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build_tokenized(path: Path, n: int, lo: int, hi: int, seed: int = 0) -> list[int]:
    import torch
    from datasets import Dataset

    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    ids = [torch.randint(0, 20000, (k,), generator=g).tolist() for k in lens]
    ds = Dataset.from_dict({"input_ids": ids, "loss_mask": [[1] * k for k in lens],
                            "seq_len": lens})
    ds.set_format("torch")
    ds.save_to_disk(str(path))
    return lens


def bare_forward(decoder, ds, batches, device) -> None:
    import torch

    from workers.stages.extract.backends import read_input_ids
    from workers.stages.extract.backends.hf import batch_inputs

    with torch.inference_mode():
        for b in batches:
            rows = read_input_ids(ds, b.indices)
            decoder(**batch_inputs(b, rows, device), use_cache=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=None)
    a = ap.parse_args()

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from contracts.extract import ExtractVllmParams
    from workers.stages.common import StageContext
    from contracts.resolved import ResolvedTarget
    from workers.stages.entry import call
    from workers.stages.extract.backends import ExtractJob, open_rows
    from workers.stages.extract.backends.hf import HFExtractor, load_decoder
    from workers.stages.extract.batching import plan_batches
    from workers.stages.extract.layers import resolve_layers
    from workers.stages.extract.writer import AsyncWriter
    from workers.stages.tinymodel import build_tiny_target

    n, lo, hi = (96, 16, 384) if a.quick else (384, 16, 1024)
    rounds = a.rounds or (2 if a.quick else 3)
    tmp = Path(tempfile.mkdtemp(prefix="bench_extract_"))
    target = build_tiny_target(tmp / "target", arch="qwen3")
    tok = tmp / "tokenized"
    lens = build_tokenized(tok, n, lo, hi)
    config = json.loads((target / "config.json").read_text())
    tokens = sum(lens)

    # 2. storage, through the whole stage
    spec = {"inputs": {"tokenized": {"path": str(tok), "meta": {}},
                       "target": {"path": str(target), "config": config}},
            "params": {"dtype": a.dtype, "batch_tokens": a.batch_tokens, "backend": "hf"},
            "out_dir": str(tmp / "out"), "work_dir": str(tmp / "work")}
    ctx = StageContext.from_spec(spec)
    t0 = time.perf_counter()
    summary = call("extract", spec, ctx)
    stage_s = time.perf_counter() - t0
    meta = ctx.artifacts[0]["meta"]

    # 1. throughput, interleaved with a bare forward over the same batches
    plan = resolve_layers(config, "dflash", None)
    job = ExtractJob(tokenized_path=str(tok), target=ResolvedTarget(path=str(target)),
                     layers=plan, dtype=a.dtype, batch_tokens=a.batch_tokens, batch_mode="padded",
                     attn_implementation=None, folder=tmp / "bench_hs", work_dir=tmp,
                     workers=1, vllm=ExtractVllmParams())
    batches = plan_batches(list(enumerate(lens)), a.batch_tokens, "padded")
    ex = HFExtractor(job, "cpu")
    _m, bare_decoder = load_decoder(job, "cpu")  # same weights, no hooks
    ds = open_rows(str(tok))
    writer = AsyncWriter(job.folder)
    chunk = max(1, len(batches) // 8)
    chunks = [batches[i:i + chunk] for i in range(0, len(batches), chunk)]
    bare_forward(bare_decoder, ds, chunks[0], "cpu")        # warm-up both paths
    ex.run(chunks[0], writer)
    writer.drain()
    t_bare = t_ex = 0.0
    for r in range(rounds):
        for c, ch in enumerate(chunks):
            order = ("bare", "ex") if (c + r) % 2 == 0 else ("ex", "bare")
            for which in order:
                t = time.perf_counter()
                if which == "bare":
                    bare_forward(bare_decoder, ds, ch, "cpu")
                    t_bare += time.perf_counter() - t
                else:
                    ex.run(ch, writer)
                    writer.drain()
                    t_ex += time.perf_counter() - t
    writer.close()
    ex.close()
    bare_tps = rounds * tokens / t_bare
    ex_tps = rounds * tokens / t_ex
    tput_ratio = ex_tps / bare_tps
    bytes_ratio = meta["bytes"] / meta["theoretical_min_bytes"]
    pad = sum(b.compute_tokens for b in batches) / tokens

    rows = [
        ("samples / tokens", f"{n} / {tokens}"),
        ("stored layers x hidden, dtype", f"{meta['num_layers_stored']} x "
                                          f"{meta['hidden_size']}, {a.dtype}"),
        ("batches (padded, sorted)", f"{len(batches)}, positions/tokens {pad:.3f}"),
        ("bare forward tokens/s", f"{bare_tps:,.0f}"),
        ("extract tokens/s (hooks+copy+write)", f"{ex_tps:,.0f}"),
        ("throughput ratio (target >= 0.85)", f"{tput_ratio:.3f}"),
        ("whole stage incl. model load", f"{stage_s:.2f} s ({summary['tokens_per_s']:,.0f} "
                                         f"tokens/s in the backend)"),
        ("bytes written", f"{meta['bytes']:,}"),
        ("theoretical minimum", f"{meta['theoretical_min_bytes']:,}"),
        ("bytes ratio (target <= 1.02)", f"{bytes_ratio:.4f}"),
    ]
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    print(json.dumps([
        {"bench": "extract", "metric": "tokens_per_s", "value": round(ex_tps, 1),
         "baseline": round(bare_tps, 1), "ratio": round(tput_ratio, 4), "target": 0.85,
         "pass": tput_ratio >= 0.85},
        {"bench": "extract", "metric": "bytes_written", "value": meta["bytes"],
         "baseline": meta["theoretical_min_bytes"], "ratio": round(bytes_ratio, 5),
         "target": 1.02, "pass": bytes_ratio <= 1.02},
    ]))


if __name__ == "__main__":
    main()
