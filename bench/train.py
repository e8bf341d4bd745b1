"""Benchmark the train stage's training loop against a bare speculators training step (CPU).

For each drafter type (DFlash, EAGLE-3) on the tiny Qwen3 target:

  job   the whole stage (`workers.stages.train.run`, offline mode): per-step wall time of its
        loop, which includes reading hidden states from disk and packing them (speculators'
        ArrowDataset + CollateFn), metric accumulation and logging, TensorBoard, progress
        events and its periodic checkpoints;
  bare  the minimal step written directly with speculators' classes (decoder config, model
        `from_training_args`, `get_trainer_kwargs`, `build_optimizers`): forward + loss,
        backward, clip, optimizer step, over the same packed batches, built in memory first.

The two are interleaved in chunks of `--chunk` steps in one process (the job's loop calls the
bench between steps, outside its timed region, and the bench runs that many bare steps), so
load from other processes on a shared box hits both alike. The statistic is the median step
time over all chunks but the first. ratio = bare / job; target >= 0.9.

    OMP_NUM_THREADS=1 python bench/train.py [--quick]

Prints a table, then as the last line a JSON list of {"bench", "metric", "value",
"baseline", "ratio", "target", "pass"}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import emit, result

TARGET_RATIO = 0.9
LAYERS = [1, 4, 7]


def build_inputs(base: Path, rows: int) -> tuple[Path, Path, Path]:
    """Tiny random target, a tokenized set of random-length rows, hidden states of the right
    shape (random values: a step costs the same whatever they hold)."""
    import torch
    from datasets import Dataset
    from safetensors.torch import save_file

    from workers.stages.tinymodel import build_tiny_target

    target = build_tiny_target(base / "target")
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(64, 320, (rows,), generator=g).tolist()
    ids = [torch.randint(0, 30000, (n,), generator=g) for n in lens]
    masks = [(torch.arange(n) >= n // 4).long() for n in lens]  # prompt quarter unmasked
    tok = base / "tokenized"
    ds = Dataset.from_dict({"input_ids": [x.tolist() for x in ids],
                            "loss_mask": [m.tolist() for m in masks], "seq_len": lens})
    ds.set_format("torch")
    ds.save_to_disk(str(tok))
    freq: dict[int, int] = {}
    for x, m in zip(ids, masks, strict=True):
        for t in x[m.bool()].tolist():
            freq[t] = freq.get(t, 0) + 1
    torch.save(freq, tok / "token_freq.pt")
    hs = base / "hidden_states"
    hs.mkdir()
    for i, x in enumerate(ids):
        save_file({"hidden_states": torch.randn(len(x), len(LAYERS) + 1, 64, generator=g),
                   "token_ids": x}, str(hs / f"hs_{i}.safetensors"))
    (hs / "meta.json").write_text(json.dumps({"layer_ids": LAYERS}))
    return target, tok, hs


def drafter_params(kind: str) -> dict:
    if kind == "dflash":  # docs/FIELD-NOTES.md demo settings
        return {"type": "dflash", "num_layers": 1, "block_size": 8, "num_anchors": 128,
                "draft_vocab_size": 2048, "mask_token_id": 151643}
    return {"type": "eagle3", "num_layers": 1, "ttt_steps": 4, "draft_vocab_size": 2048}


def job_spec(base: Path, inputs, kind: str, steps: int, seq: int) -> dict:
    target, tok, hs = inputs
    cfg = json.loads((target / "config.json").read_text())
    job = base / f"job_{kind}"
    return {"params": {"drafter": drafter_params(kind), "seq_length": seq, "epochs": 1000,
                       "max_steps": steps},
            "inputs": {"target": {"path": str(target), "tokenizer_path": str(target),
                                  "config": cfg},
                       "tokenized": {"path": str(tok), "meta": {}},
                       "hidden_states": {"path": str(hs), "meta": {"layer_ids": LAYERS}}},
            "out_dir": str(job / "out"), "work_dir": str(job / "work"),
            "events_path": str(job / "events.jsonl")}


def interleaved(base: Path, inputs, kind: str, steps: int, seq: int,
                chunk: int) -> tuple[list[float], list[float]]:
    """(job step times, bare step times), alternating chunk by chunk, first chunk dropped."""
    from workers.stages.common import StageContext
    from workers.stages.entry import parse
    from workers.stages.train import loop
    from workers.stages.train.job import resolve_job

    spec = job_spec(base, inputs, kind, steps, seq)
    params, typed = parse("train", spec)
    job = resolve_job(params, typed, StageContext.from_spec(spec), "offline", cuda=False)
    bare = Bare(inputs, kind, seq, steps)
    bare_times: list[float] = []

    def between(step: int) -> None:
        if step % chunk == 0:
            bare_times.extend(bare.step() for _ in range(chunk))

    ctx = StageContext.from_spec(spec)
    job_times = loop.train(job, ctx, after_step=between)["step_times"]
    ctx.close()
    return job_times[chunk:], bare_times[chunk:]


class Bare:
    """The minimal speculators training step, over batches prepared in memory."""

    def __init__(self, inputs, kind: str, seq: int, n_batches: int):
        import torch
        from hs_connectors import FileTransfer
        from speculators.model import SpeculatorModel
        from speculators.models.eagle3.data import shift_batch
        from speculators.train.cli import create_transformer_layer_config
        from speculators.train.data import ArrowDataset, CollateFn
        from speculators.train.distributed_batch_sampler import (
            MultipackDistributedBatchSamplerV2,
        )
        from speculators.train.optimizers import build_optimizers
        from speculators.train.trainer import TrainerConfig
        from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

        target, tok, hs = inputs
        d = drafter_params(kind)
        torch.manual_seed(0)
        freq = torch.load(tok / "token_freq.pt")
        d2t, t2d = build_vocab_mappings_from_distribution(freq, d["draft_vocab_size"], 151669)
        arch = "qwen3" if kind == "dflash" else "llama"
        layer_cfg = create_transformer_layer_config(str(target), 1, arch, None, 2048, [])
        cls = SpeculatorModel.registry[kind]
        self.model = cls.from_training_args(
            verifier_config=layer_cfg, t2d=t2d, d2t=d2t, verifier_name_or_path=str(target),
            target_layer_ids=LAYERS, draft_attn_impl="sdpa",
            draft_vocab_size=d["draft_vocab_size"], block_size=d.get("block_size", 8),
            mask_token_id=d.get("mask_token_id"), ttt_steps=d.get("ttt_steps", 1),
            norm_before_residual=True, norm_before_fc=True, norm_output=True)
        self.model.train()
        self.kwargs, _ = cls.get_trainer_kwargs(
            loss_fn="ce" if kind == "dflash" else "kl_div", loss_implementation="eager",
            max_anchors=d.get("num_anchors", 512), per_position_loss_weight="dpace",
            ttt_steps=d.get("ttt_steps", 1), ttt_step_loss_decay=1.0)
        self.opts = build_optimizers(self.model, TrainerConfig(
            lr=1e-2, num_epochs=1, save_path="", optimizer="muon", muon_lr=1e-2))
        ds = ArrowDataset(seq, str(tok), transfer=FileTransfer(hs), on_missing="raise",
                          hidden_states_dtype=torch.float32)
        sampler = MultipackDistributedBatchSamplerV2(seq, ds.approx_lengths, 1, 0, seed=0)
        collate = CollateFn(seq, 64, len(LAYERS), torch.float32,
                            shift_batch if kind == "eagle3" else None)
        self.batches = []
        epoch = 0
        while len(self.batches) < n_batches:
            sampler.set_epoch(epoch)
            for idx in sampler:
                b = collate([ds[int(i)] for i in idx])
                self.batches.append({k: v for k, v in b.items() if torch.is_tensor(v)})
            epoch += 1
        self.batches = self.batches[:n_batches]
        self.next = 0

    def step(self) -> float:
        """One bare training step on the next batch (in the job's order); its wall time."""
        import torch

        b = self.batches[self.next % len(self.batches)]
        self.next += 1
        t0 = time.perf_counter()
        _d, loss, _m = self.model(**b, **self.kwargs)
        for o in self.opts:
            o.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        for o in self.opts:
            o.step()
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--chunk", type=int, default=5)
    a = ap.parse_args()
    rows, seq = (96, 512) if a.quick else (400, 1024)
    steps = {"dflash": 30 if a.quick else 100, "eagle3": 15 if a.quick else 40}

    results, table = [], []
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        base = Path(tmp)
        inputs = build_inputs(base, rows)
        for kind in ("dflash", "eagle3"):
            chunk = min(a.chunk, max(1, steps[kind] // 4))
            job_t, bare_t = interleaved(base, inputs, kind, steps[kind], seq, chunk)
            job_s, bare_s = statistics.median(job_t), statistics.median(bare_t)
            table.append((kind, steps[kind], seq, job_s, bare_s, statistics.mean(job_t),
                          statistics.mean(bare_t), bare_s / job_s))
            # value and baseline are steps/s, so ratio = bare step time / job step time.
            results.append(result("train", f"{kind}_steps_per_s_vs_bare_step", 1 / job_s,
                                  1 / bare_s, TARGET_RATIO))
    print(f"{'drafter':8} {'steps':>5} {'seq':>5} {'job s/step':>11} {'bare s/step':>12} "
          f"{'job mean':>9} {'bare mean':>10} {'ratio':>6}")
    for kind, n, s_, j, b, jm, bm, r in table:
        print(f"{kind:8} {n:5d} {s_:5d} {j:11.4f} {b:12.4f} {jm:9.4f} {bm:10.4f} {r:6.3f}")
    emit(results)


if __name__ == "__main__":
    main()
