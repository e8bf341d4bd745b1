"""Ingest throughput and memory on a generated JSONL of mixed chat formats.

    python bench/ingest.py              # 1 GB file
    python bench/ingest.py --quick      # 50 MB
    python bench/ingest.py --size-mb 200

Generates a JSONL mixing the formats ingest reads (OpenAI messages with reasoning and tools,
ShareGPT, Alpaca, OpenOrca, UltraChat, Magicoder, Evol-CodeAlpaca, OpenAssistant trees, bare
prompts; some non-ASCII text; one invalid line in 2000), runs the `ingest` stage on it in a
child process (`python -m workers.stages ingest`) and reports MB/s and records/s over the
stage's own run time (from the start of `run()` to the artifact, i.e. without interpreter
start-up and imports; the child's whole wall is printed too), its CPU time, and its peak RSS
(`getrusage(RUSAGE_CHILDREN).ru_maxrss`: the child's high-water mark).

Baseline, measured in the same run over the same file: the bare loop
`for line in open(f, "rb"): orjson.loads(line)`, run once before and once after the ingest, the
faster of the two kept (so the ratio is not flattered by a cold cache or a busy neighbour).
Targets: ingest throughput at least 0.5 x the baseline (wall clock); peak RSS under 500 MB.
The CPU-time ratio is printed beside it because wall clocks on a shared box swing with the
load average, which is printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]

_WORDS = ("the of and to in is was for on that with as by at from it an be this are or have "
          "which not but one all their has more were been when there can also into other only "
          "new some time could these two may first then do any like my now over such our man "
          "function return value list string error because however example python code data "
          "model train result step number file print class method loop index array").split()
_UNICODE = ("naïve café déjà vu 東京 数据 模型 训练 Привет мир 🙂 ✓ — “quoted” ").split()


class TextPool:
    """Random word text, cheap to produce: slices of one long pre-generated string."""

    def __init__(self, rng: random.Random, size: int = 1 << 21):
        words = [rng.choice(_WORDS) for _ in range(size // 5)]
        for i in range(0, len(words), 37):
            words[i] += rng.choice([".", ",", "\n", ".\n\n", ":", "?"])
        self.ascii = " ".join(words)
        self.uni = " ".join(rng.choice(_WORDS + _UNICODE) for _ in range(size // 50))
        self.rng = rng

    def __call__(self, n_chars: int) -> str:
        src = self.uni if self.rng.random() < 0.05 else self.ascii
        n_chars = min(n_chars, len(src) - 1)
        i = self.rng.randrange(0, len(src) - n_chars)
        return src[i:i + n_chars]


_TOOLS = [{"type": "function", "function": {"name": "search", "description": "Search the web",
                                             "parameters": {"type": "object", "properties": {
                                                 "q": {"type": "string"}}, "required": ["q"]}}}]


def make_record(i: int, t: TextPool, rng: random.Random) -> dict:
    k = i % 10
    L = lambda lo, hi: rng.randint(lo, hi)  # noqa: E731
    if k == 0:
        return {"messages": [{"role": "system", "content": t(L(20, 200))},
                             {"role": "user", "content": t(L(50, 800))},
                             {"role": "assistant",
                              "content": f"<think>\n{t(L(100, 1500))}\n</think>\n\n{t(L(100, 2000))}"}]}
    if k == 1:
        return {"messages": [{"role": "user", "content": t(L(50, 400))},
                             {"role": "assistant", "content": None, "tool_calls": [
                                 {"id": f"c{i}", "type": "function", "function": {
                                     "name": "search", "arguments": json.dumps({"q": t(30)})}}]},
                             {"role": "tool", "tool_call_id": f"c{i}", "content": t(L(50, 600))},
                             {"role": "assistant", "content": t(L(50, 800))}], "tools": _TOOLS}
    if k == 2:
        turns = []
        for j in range(L(1, 4)):
            turns += [{"from": "human", "value": t(L(20, 500))}, {"from": "gpt", "value": t(L(50, 1500))}]
        return {"id": f"sg_{i}", "conversations": turns}
    if k == 3:
        return {"instruction": t(L(20, 300)), "input": t(L(10, 300)) if i % 3 else "",
                "output": t(L(20, 1200))}
    if k == 4:
        return {"id": f"flan.{i}", "system_prompt": t(L(0, 150)), "question": t(L(50, 1500)),
                "response": t(L(10, 1000))}
    if k == 5:
        return {"id": str(i), "data": [t(L(20, 400)) for _ in range(2 * L(1, 3))]}
    if k == 6:
        return {"lang": "python", "index": i, "seed": t(100), "problem": t(L(100, 900)),
                "solution": t(L(200, 1800))}
    if k == 7:
        return {"instruction": t(L(50, 900)), "output": t(L(100, 2000))}
    if k == 8:
        if i % 50 == 8:  # an OpenAssistant tree now and then
            def node(role, depth, rank=None):
                n = {"message_id": f"m{i}_{depth}_{rank}", "role": role, "text": t(L(20, 400)),
                     "lang": "en", "deleted": False}
                if rank is not None:
                    n["rank"] = rank
                if depth < 3:
                    nxt = "assistant" if role == "prompter" else "prompter"
                    n["replies"] = [node(nxt, depth + 1, r if nxt == "assistant" else None)
                                    for r in range(2 if nxt == "assistant" else 1)]
                return n
            return {"message_tree_id": f"tree{i}", "tree_state": "ready_for_export",
                    "prompt": node("prompter", 0)}
        return {"prompt": t(L(20, 800))}
    return {"prompt": t(L(20, 400)), "completion": t(L(20, 800))}


def generate(path: Path, size_mb: float, seed: int = 0) -> tuple[int, int]:
    rng = random.Random(seed)
    pool = TextPool(rng)
    target = int(size_mb * 1e6)
    n = written = 0
    with open(path, "wb", buffering=1 << 22) as f:
        while written < target:
            if n % 2000 == 1999:
                line = b'{"messages": [{"role": "user", "content": "truncated\n'
            else:
                line = orjson.dumps(make_record(n, pool, rng)) + b"\n"
            f.write(line)
            written += len(line)
            n += 1
    return n, written


def orjson_baseline(path: Path) -> tuple[float, float]:
    """(wall, cpu) seconds of the bare loop."""
    loads = orjson.loads
    t0, c0 = time.perf_counter(), time.process_time()
    with open(path, "rb") as f:
        for line in f:
            try:
                loads(line)
            except orjson.JSONDecodeError:
                pass
    return time.perf_counter() - t0, time.process_time() - c0


def run_ingest(path: Path, work: Path) -> tuple[float, int, dict, dict]:
    spec = {"inputs": {"source": {"path": str(path), "name": "bench"}},
            "params": {"format": "auto", "max_reject_share": 0.5},
            "out_dir": str(work / "out"), "work_dir": str(work / "work"),
            "events_path": str(work / "events.jsonl")}
    work.mkdir(parents=True, exist_ok=True)
    (work / "spec.json").write_text(json.dumps(spec))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "workers.stages", "ingest", "--spec",
                           str(work / "spec.json")], cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"ingest failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    events = [json.loads(x) for x in (work / "events.jsonl").read_text().splitlines()]
    result = next(e["data"] for e in events if e["kind"] == "result")
    meta = next(e["data"]["meta"] for e in events if e["kind"] == "artifact")
    return wall, peak_kb * 1024, result, meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=float, default=1024.0)
    ap.add_argument("--quick", action="store_true", help="50 MB instead of --size-mb")
    ap.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp dir)")
    args = ap.parse_args()
    size_mb = 50.0 if args.quick else args.size_mb

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        tmp = Path(tmp)
        src = tmp / "mixed.jsonl"
        t0 = time.perf_counter()
        n_lines, n_bytes = generate(src, size_mb)
        gen_s = time.perf_counter() - t0
        (base1, cpu1) = orjson_baseline(src)
        wall, peak_rss, result, meta = run_ingest(src, tmp / "ingest")
        (base2, cpu2) = orjson_baseline(src)
        base, base_cpu = min(base1, base2), min(cpu1, cpu2)

    mb = n_bytes / 1e6
    # Throughput of the stage itself (its own clock, from the start of run() to the artifact),
    # not of interpreter start-up and imports, which the wall of the child includes.
    stage_s = result["seconds"]
    ingest_mb_s, base_mb_s = mb / stage_s, mb / base
    ratio = ingest_mb_s / base_mb_s
    ratio_cpu = base_cpu / result["cpu_seconds"]
    rss_mb = peak_rss / 1e6
    load = os.getloadavg()[0]
    rows = [
        ("file", f"{mb:.1f} MB, {n_lines} lines (generated in {gen_s:.1f} s)"),
        ("format detected", f"{meta['format']} (+ " + ", ".join(
            k for k in meta["formats"] if k != meta["format"]) + ")"),
        ("records / rejected", f"{meta['num_records']} / {meta['num_rejected']}"),
        ("ingest stage", f"{stage_s:.2f} s wall, {result['cpu_seconds']:.2f} s CPU (both threads); "
                         f"child process {wall:.2f} s with start-up"),
        ("ingest throughput", f"{ingest_mb_s:.1f} MB/s, {meta['num_records'] / stage_s:.0f} records/s"),
        ("orjson.loads loop", f"{base:.2f} s = {base_mb_s:.1f} MB/s, {base_cpu:.2f} s CPU "
                              f"(runs: {base1:.2f} s, {base2:.2f} s)"),
        ("ratio ingest / orjson", f"{ratio:.3f} wall (target >= 0.5); {ratio_cpu:.3f} CPU time"),
        ("peak RSS of the ingest", f"{rss_mb:.0f} MB (target < 500 MB)"),
        ("load average (1 min)", f"{load:.1f} on {os.cpu_count()} CPUs (a busy box skews walls)"),
    ]
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    print(json.dumps([
        {"bench": "ingest", "metric": "throughput_ratio_vs_orjson_loads", "value": round(ratio, 4),
         "baseline": round(base_mb_s, 2), "ratio": round(ratio, 4), "target": 0.5,
         "pass": ratio >= 0.5, "ingest_mb_s": round(ingest_mb_s, 2),
         "records_per_s": round(meta["num_records"] / stage_s, 1), "cpu_ratio": round(ratio_cpu, 4),
         "size_mb": round(mb, 1), "loadavg": round(load, 2)},
        {"bench": "ingest", "metric": "peak_rss_mb", "value": round(rss_mb, 1), "baseline": None,
         "ratio": round(rss_mb / 500.0, 4), "target": 500, "pass": rss_mb < 500},
    ]))


if __name__ == "__main__":
    main()
