"""Benchmark: the prepare stage against the tokenizer floor, measured in the same run.

    python bench/prepare.py            # 20,000 generated multi-turn records
    python bench/prepare.py --quick    # 2,000
    python bench/prepare.py --records N --workers W

Records are generated (seeded): system prompts, 1-4 user/assistant exchanges, reasoning,
tool calls with tool results, unicode, some empty contents. Tokenizer: the real Qwen3 one,
with its own chat template.

floor  = the fast tokenizer batch-encoding the already rendered texts (`tokenizer(texts)`,
         Rust, all cores), render time excluded.
stage  = `workers.stages.prepare.run` end to end: read the parquet dataset, render twice
         (plain + marked), batch-encode with offsets, self-check every turn, write the
         `save_to_disk` folder, token_freq.pt, rejects.
The last line is the JSON result: ratio = stage tokens/s / floor tokens/s (target >= 0.5).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORDS = ("the of and to in is for that with as on are this be by from it at an or which you "
         "model token data train value function return list string number result error file "
         "system python code example output input layer batch memory speed draft target "
         "decode accept sample prompt answer question because however therefore").split()
UNICODE = ["café", "naïve", "über", "東京", "数据", "🙂", "👋🏽", "∑", "—", "Ωmega", "ß", "𝔸"]
CODE = ["def f(x):\n    return x * 2\n", "for i in range(10):\n    print(i)\n",
        "```python\nimport os\nprint(os.getcwd())\n```", "SELECT * FROM t WHERE id = 1;"]


def _text(rng: random.Random, lo: int, hi: int) -> str:
    n = rng.randint(lo, hi)
    out = []
    for k in range(n):
        r = rng.random()
        if r < 0.03:
            out.append(rng.choice(UNICODE))
        elif r < 0.04:
            out.append("\n" + rng.choice(CODE))
        elif r < 0.08:
            out.append(str(rng.randint(0, 9999)))
        else:
            out.append(rng.choice(WORDS))
        if rng.random() < 0.07:
            out[-1] += rng.choice([".", ",", "?", "!\n", ".\n\n"])
    return " ".join(out).strip()


def make_records(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    recs = []
    for i in range(n):
        msgs = []
        if rng.random() < 0.5:
            msgs.append({"role": "system", "content": _text(rng, 5, 30)})
        for _t in range(rng.randint(1, 4)):
            msgs.append({"role": "user", "content": _text(rng, 5, 60)})
            if rng.random() < 0.15:
                call = {"type": "function", "function": {
                    "name": rng.choice(["get_weather", "search", "run_sql"]),
                    "arguments": {"q": _text(rng, 1, 6), "n": rng.randint(1, 9)}}}
                msgs.append({"role": "assistant", "content": "" if rng.random() < 0.5
                             else _text(rng, 3, 20), "tool_calls": [call]})
                msgs.append({"role": "tool", "content": _text(rng, 5, 40),
                             "name": call["function"]["name"]})
            a = {"role": "assistant", "content": _text(rng, 20, 160)}
            if rng.random() < 0.4:
                a["reasoning"] = _text(rng, 10, 80)
            msgs.append(a)
        recs.append({"id": f"b{i}", "source": f"bench:{i}", "messages": msgs})
    return recs


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the stage's workers)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--quick", action="store_true", help="2,000 records")
    ap.add_argument("--workers", type=int, default=None, help="default: the usable cores")
    a = ap.parse_args()
    n = 2000 if a.quick else a.records

    from workers.stages.common import StageContext
    from workers.stages.prepare import run
    from workers.stages.prepare.masks import build_masker, load_tokenizer
    from tests.stages.records_support import write_dataset
    from workers.stages.tinymodel import qwen3_tokenizer_dir

    tok_dir = qwen3_tokenizer_dir()
    tok = load_tokenizer(tok_dir)
    recs = make_records(n)
    with tempfile.TemporaryDirectory(prefix="bench_prepare_") as tmp:
        tmp = Path(tmp)
        write_dataset(tmp / "ds", recs)

        # floor: render (untimed), then batch-encode the rendered texts
        masker = build_masker(tok, tok.chat_template)
        from workers.stages.prepare.templates import to_template_messages

        texts = [masker.template.render(to_template_messages(r["messages"])) for r in recs]
        c0 = _cpu()
        t0 = time.perf_counter()
        enc = tok(texts, add_special_tokens=False)
        floor_s = time.perf_counter() - t0
        floor_cpu = _cpu() - c0
        floor_tokens = sum(len(x) for x in enc["input_ids"])
        t0 = time.perf_counter()
        tok.backend_tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        fast_s = time.perf_counter() - t0
        del enc

        spec = {"inputs": {"dataset": {"path": str(tmp / "ds"), "meta": {}},
                           "target": {"path": str(tok_dir), "tokenizer_path": str(tok_dir),
                                      "chat_template": None, "chat_template_kwargs": {},
                                      "config": {}}},
                "params": {"seq_length": 8192, "num_workers": a.workers},
                "out_dir": str(tmp / "out"), "work_dir": str(tmp / "work")}
        ctx = StageContext.from_spec(spec)
        c0 = _cpu()
        t0 = time.perf_counter()
        summary = run(spec, ctx)
        stage_s = time.perf_counter() - t0
        stage_cpu = _cpu() - c0
        meta = ctx.artifacts[0]["meta"]

    stage_tps = meta["num_tokens"] / stage_s
    floor_tps = floor_tokens / floor_s
    ratio = stage_tps / floor_tps
    rows = [
        ("records", f"{n:,}"),
        ("rows kept / rejected", f"{summary['num_rows']:,} / {summary['num_rejected']:,} "
                                 f"{summary['rejected_by_reason']}"),
        ("tokens (masked)", f"{meta['num_tokens']:,} ({meta['num_masked_tokens']:,})"),
        ("floor: tokenizer(texts)", f"{floor_s:.2f} s  {floor_tps / 1e6:.3f} M tok/s  "
                                    f"(cpu {floor_cpu:.1f} s)"),
        ("  (encode_batch_fast, no offsets)", f"{fast_s:.2f} s  "
                                              f"{floor_tokens / fast_s / 1e6:.3f} M tok/s"),
        ("prepare stage", f"{stage_s:.2f} s  {stage_tps / 1e6:.3f} M tok/s  "
                          f"{n / stage_s:,.0f} records/s  (cpu {stage_cpu:.1f} s, all processes)"),
        ("  stage timings", " ".join(f"{k} {v:.2f} s" for k, v in meta["timings_s"].items())),
        ("ratio stage / floor", f"{ratio:.2f}  (target >= 0.5)"),
        ("  cpu-time ratio", f"{floor_cpu / stage_cpu:.2f}  (floor cpu / stage cpu: the same "
                             "ratio on an idle machine, less sensitive to other load)"),
        ("cores", str(len(os.sched_getaffinity(0)))),
    ]
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    print(json.dumps({"bench": "prepare", "metric": "tokens_per_s", "value": round(stage_tps),
                      "baseline": round(floor_tps), "ratio": round(ratio, 3), "target": 0.5,
                      "pass": ratio >= 0.5, "records_per_s": round(n / stage_s, 1),
                      "cpu_ratio": round(floor_cpu / stage_cpu, 3)}))


if __name__ == "__main__":
    main()
