"""The seeds' scale: how each data-plane stage's cost grows with its records.

    python bench/scale.py                          # N = 12.5K, 50K, 200K, 800K (hours on 2 cores)
    python bench/scale.py --sizes 12500,50000      # some of them
    python bench/scale.py --sizes 300 --quick      # the tiny variant the test suite runs

Through the API as a user would, on a throwaway deployment (tests/service/stack.py: its own
PostgreSQL database, Redis DB 15, one API process and one worker process with 2 CPU slots):
at every N, six synthetic source files in their datasets' native shapes (bench/_scale_data.py
states the shapes, the length distributions and where they come from; ~3% cross-source
duplicates after whitespace changes, a few broken lines per source) are written under the
data root, then

  ingest   `POST /v1/datasets {"name", "path"}` for each of the six, one after the other
  mix      `POST /v1/datasets/mix` with the curator's weights (OpenOrca 0.5 of a file twice its
           share, the rest 1.0, LIMA all of it), dedupe on
  plan     `POST /v1/plans` of an online run at seq 4096 on the mixed dataset
  prepare  `POST /v1/jobs {"type": "prepare"}` with the real Qwen3 tokenizer (the target is a
           tiny Qwen3 with that tokenizer), seq_length 4096

Per stage and size: the job's wall time (its `started_at` to `finished_at`; plan: the request's
round trip), records/s, the peak RSS of the stage's whole process tree (every 0.1 s from /proc,
bench/_scale_measure.py), the bytes of the artifacts it wrote, the database rows it added
(jobs, job_events, artifacts), and k, the growth exponent of wall time from the previous size
(cost ~ N^k; the JSON line carries the least-squares k over all sizes).

Baselines, measured in the same run: the tokenizer floor (the same tokenizer batch-encoding
the same rendered texts in this process, `tokenizer(texts)` 8,192 texts a call, on the whole
mixed dataset or its first `--floor-records` records, half of the calls right before the
prepare job and half right after), and HF `datasets`
(`load_dataset(json|parquet)` + `to_parquet`, in a child process) on the same six files for
ingest (sizes up to `--hf-max`).

Targets (the last line, a JSON list): per stage k <= 1.1; peak RSS of the streaming stages
grows <= 1.25x from 50K to 800K; database rows per job bounded (events per job <= 1 per
second of its wall + 20); whole data plane at the largest size under 3 GB; prepare >= 0.75 of
the floor; ingest >= 1.5x HF datasets.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._common import REDIS_DB  # noqa: E402
from bench._scale_data import write_sources  # noqa: E402
from bench._scale_measure import (TreeRss, db_counts, fmt_n, k_between, k_fit,  # noqa: E402
                                  print_table)

DATA_STAGES = ("ingest", "mix", "plan", "prepare")
STREAMING = ("ingest", "mix", "prepare")


def _ts(s: str | None) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp() if s else 0.0


def _job_wall(job: dict) -> float:
    return _ts(job["finished_at"]) - _ts(job["started_at"])


class Bench:
    def __init__(self, stack, client, rss: TreeRss):
        self.stack, self.c, self.rss = stack, client, rss

    def measure(self, stage: str, n: int, fn) -> dict:
        """Run fn() -> (wall_s, records, bytes, extra); add RSS and DB rows."""
        before = db_counts(self.stack.engine())
        self.rss.reset()
        wall, records, nbytes, extra = fn()
        self.rss.sample()
        after = db_counts(self.stack.engine())
        return {"stage": stage, "n": n, "wall_s": wall, "records": records,
                "rss_mb": self.rss.peak.get("plan" if stage == "plan" else stage, 0) / 1e6,
                "bytes": nbytes, "rows": {k: after[k] - before[k] for k in after}, **extra}

    def eta_at_10(self, job: dict) -> dict:
        """The ETA the job showed at the first progress event past 10% of its (last phase's)
        total, against the time that actually remained until it finished."""
        try:
            return self._eta_at_10(job)
        except Exception as e:  # noqa: BLE001  a measure must not lose the run's other numbers
            return {"error": repr(e)}

    def _eta_at_10(self, job: dict) -> dict:
        evs, after = [], 0
        while True:
            page = self.c.events(job["id"], after_seq=after, limit=1000)
            if not page:
                break
            evs += [e for e in page if e["kind"] == "progress"]
            after = page[-1]["seq"]
        phase = evs[-1]["data"].get("stage") if evs else None
        for e in evs:
            d = e["data"]
            if d.get("stage") == phase and d.get("total") and d["done"] >= 0.1 * d["total"] \
                    and d["done"] < d["total"] and d.get("eta_s") is not None:
                left = _ts(job["finished_at"]) - _ts(e["at"])
                return {"eta_s": round(d["eta_s"], 1), "remained_s": round(left, 1),
                        "eta_error": round(abs(d["eta_s"] - left) / left, 3) if left else None,
                        "phase": phase, "progress_events": len(evs)}
        return {"progress_events": len(evs)}

    def art_bytes(self, ids: list[str]) -> int:
        return sum(self.c.get_artifact(a)["bytes"] or 0 for a in ids if a)

    def ingest(self, folder: Path, srcs, n: int) -> tuple[dict, dict]:
        ids = {}

        def go():
            wall = records = nbytes = rejected = 0
            jobs = {}
            for s in srcs:
                d = self.c.add_dataset(f"{s.name}-{n}", str(folder / s.file))
                d = self.c.wait_dataset(d["id"], timeout=7200, poll=0.5)
                if d["status"] != "ready":
                    raise RuntimeError(f"ingest of {s.file} failed: {d['error']}")
                ids[s.name] = d["id"]
                jobs[s.name] = round(_job_wall(self.c.get_job(d["job_id"])), 3)
                wall += jobs[s.name]
                records += d["num_records"]
                rejected += d["num_rejected"]
                nbytes += self.art_bytes([d["artifact_id"]])
            return wall, records, nbytes, {"rejected": rejected, "jobs": jobs}
        return self.measure("ingest", n, go), ids

    def mix(self, ids: dict, srcs, n: int) -> tuple[dict, dict]:
        out = {}

        def go():
            d = self.c.mix_datasets(f"seeds-{n}", [{"dataset_id": ids[s.name], "weight": s.weight}
                                                   for s in srcs], dedupe=True, seed=0)
            d = self.c.wait_dataset(d["id"], timeout=7200, poll=0.5)
            if d["status"] != "ready":
                raise RuntimeError(f"mix failed: {d['error']}")
            out.update(d)
            j = self.c.get_job(d["job_id"])
            return (_job_wall(j), d["num_records"], self.art_bytes([d["artifact_id"]]),
                    {"eta": self.eta_at_10(j)})
        return self.measure("mix", n, go), out

    def run_body(self, target_id: str, dataset_id: str) -> dict:
        return {"name": "seeds-scale", "target_id": target_id, "dataset_id": dataset_id,
                "drafter": {"type": "dflash", "num_layers": 1, "block_size": 4},
                "mode": "online",
                "stages": {"generate": None, "prepare": {"seq_length": 4096}, "extract": None,
                           "train": {"seq_length": 4096, "epochs": 1}, "evaluate": None}}

    def plan(self, target_id: str, ds: dict, n: int) -> tuple[dict, dict]:
        got = {}

        def go():
            t0 = time.perf_counter()
            got.update(self.c.plan(self.run_body(target_id, ds["id"]), timeout=600))
            return time.perf_counter() - t0, ds["num_records"], 0, {"ok": got.get("ok")}
        return self.measure("plan", n, go), got

    def prepare(self, target_id: str, ds: dict, n: int, workers: int | None) -> tuple[dict, dict]:
        got = {}

        def go():
            params: dict = {"seq_length": 4096}
            if workers:
                params["num_workers"] = workers
            j = self.c.submit_job("prepare", params=params,
                                  inputs={"dataset": ds["id"], "target": target_id})
            j = self.c.wait_job(j["id"], timeout=14400, poll=1.0)
            if j["status"] != "succeeded":
                raise RuntimeError(f"prepare {j['status']}: {j['error']}")
            art = self.c.get_artifact(j["outputs"][0])
            got.update({"job": j, "meta": art["meta"]})
            return _job_wall(j), ds["num_records"], art["bytes"] or 0, {
                "tokens": art["meta"].get("num_tokens"), "eta": self.eta_at_10(j)}
        return self.measure("prepare", n, go), got


def tokenizer_floor(dataset_dir: Path, tok_dir: Path, limit: int = 0, batch: int = 8192,
                    part: int = 0, parts: int = 1) -> tuple[int, float, int]:
    """(tokens, seconds, records) of the fast tokenizer batch-encoding the rendered texts of
    the first `limit` records (0: all of them, the set prepare tokenized), `batch` texts a
    call (rendering untimed); with `parts` > 1 only the batches whose number is `part`
    modulo `parts`.

    The whole set by default: on a 50K-record prefix the first call alone is 15-30% slower
    than the following ones (the tokenizer's caches and the allocator warm up; measured
    1.03-1.31 M tok/s cold vs 1.44 M warm on the 800K set's prefix), so a prefix measured
    once flattered prepare, whose workers warm up once over the whole set. The bench runs
    it in two parts, one before the prepare job and one after: this machine's speed drifts
    by 10% over minutes (the floor alone measured 1.40-1.56 M tok/s on the same set), and
    a floor measured only after the job compared it with another machine state."""
    from workers.stages.prepare.masks import build_masker, load_tokenizer
    from workers.stages.prepare.templates import to_template_messages
    from workers.stages.records import iter_records

    tok = load_tokenizer(tok_dir)
    masker = build_masker(tok, tok.chat_template)
    tokens = used = 0
    spent = 0.0
    texts: list[str] = []

    def encode() -> None:
        nonlocal tokens, spent, used
        t0 = time.perf_counter()
        enc = tok(texts, add_special_tokens=False)
        spent += time.perf_counter() - t0
        tokens += sum(len(x) for x in enc["input_ids"])
        used += len(texts)
        texts.clear()

    for k, r in enumerate(iter_records(dataset_dir)):
        if k == limit and limit:
            break
        if (k // batch) % parts != part:
            continue
        texts.append(masker.template.render(to_template_messages(r["messages"])))
        if len(texts) >= batch:
            encode()
    if texts:
        encode()
    return tokens, spent, used


HF_SCRIPT = r"""
import sys, time, resource
from datasets import load_dataset
t0 = time.perf_counter()
for f in sys.argv[2:]:
    kind = "parquet" if f.endswith(".parquet") else "json"
    ds = load_dataset(kind, data_files=f, split="train", cache_dir=sys.argv[1])
    ds.to_parquet(sys.argv[1] + "/out.parquet")
print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _clean_copy(src: Path, dst: Path) -> Path:
    """The file without its broken lines (HF datasets stops at the first one): lines that
    parse as an object with the first line's keys."""
    import orjson

    if src.suffix == ".parquet":
        return src
    keys = None
    with open(src, "rb") as f, open(dst, "wb") as out:
        for line in f:
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if type(obj) is dict and (keys is None or obj.keys() == keys):
                keys = keys or obj.keys()
                out.write(line)
    return dst


def hf_baseline(files: list[Path], work: Path) -> tuple[float, float]:
    """(wall s, peak RSS MB) of HF datasets loading and writing back the same files (their
    broken lines removed first, untimed)."""
    cache = work / "hf_cache"
    cache.mkdir(parents=True, exist_ok=True)
    files = [_clean_copy(f, cache / f.name) for f in files]
    os.sync()  # the copies (and what ran before) settled, as ingest's sources were
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(cache)}
    t0 = time.perf_counter()  # the child's whole wall, start-up included, as a job's is
    p = subprocess.run([sys.executable, "-c", HF_SCRIPT, str(cache), *map(str, files)],
                       capture_output=True, text=True, env=env)
    wall_s = time.perf_counter() - t0
    shutil.rmtree(cache, ignore_errors=True)
    if p.returncode != 0:
        raise RuntimeError("HF datasets baseline failed:\n" + p.stderr[-2000:])
    _inner, rss_kb = p.stdout.split()[-2:]
    return wall_s, int(rss_kb) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="12500,50000,200000,800000")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="no baselines (the test suite's run)")
    ap.add_argument("--floor-records", type=int, default=0,
                    help="records the tokenizer floor encodes (0: the whole mixed set)")
    ap.add_argument("--hf-max", type=int, default=800_000, help="HF baseline up to this N")
    ap.add_argument("--prepare-workers", type=int, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="work folder (default: temp)")
    ap.add_argument("--stages", choices=("all", "ingest"), default="all",
                    help="ingest: only the ingest jobs (and the HF baseline), no mix, plan, "
                         "prepare or tokenizer floor")
    a = ap.parse_args()
    sizes = [int(float(x)) for x in a.sizes.split(",") if x]
    stages = ("ingest",) if a.stages == "ingest" else DATA_STAGES

    from draftyard import Client
    from tests.service.stack import Stack
    from workers.stages.tinymodel import build_tiny_target, qwen3_tokenizer_dir

    # SIGTERM (a killed bench) still stops the stack and drops its database
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix="bench_scale_", dir=a.keep))
    data_root, model_root = tmp / "data", tmp / "models"
    model_root.mkdir(parents=True)
    stack = Stack("scale", REDIS_DB, {"DRAFTYARD_CPU_SLOTS": "2",
                                      "DRAFTYARD_DATA_ROOTS": str(data_root),
                                      "DRAFTYARD_MODEL_ROOTS": str(model_root)})
    rows: list[dict] = []
    extra: dict = {"floor": {}, "hf": {}, "prepare_tps": {}}
    rss = None
    try:
        stack.create()
        stack.start_api()
        worker = stack.start_worker("s1")
        rss = TreeRss([stack.procs[0].pid, worker.pid]).start()
        c = Client(stack.url, stack.token, timeout=600)
        if "mix" in stages:
            tgt_dir = build_tiny_target(model_root / "qwen3-tiny", arch="qwen3")
            target = c.create_target("qwen3-tiny", str(tgt_dir))
        b = Bench(stack, c, rss)
        for n in sizes:
            folder = data_root / f"n{n}"
            t0 = time.perf_counter()
            srcs = write_sources(folder, n, seed=a.seed)
            # the files settled on disk before anything is timed: writing back 1.3 GB of just
            # written sources ate into the first jobs (OpenOrca's 800K ingest 4.9 s, 4.0 s
            # with the files settled), and HF datasets reads the same files settled
            os.sync()
            print(f"# N={fmt_n(n)}: sources written in {time.perf_counter() - t0:.1f} s "
                  f"({sum(f.stat().st_size for f in folder.iterdir()) / 1e6:.0f} MB)",
                  flush=True)
            first = len(rows)
            r, ids = b.ingest(folder, srcs, n)
            rows.append(r)
            note = f"# N={fmt_n(n)}: {r['records']:,} records ingested, {r['rejected']} rejected " \
                   "(the broken lines)"
            if "mix" in stages:
                r, ds = b.mix(ids, srcs, n)
                rows.append(r)
                r, plan = b.plan(target["id"], ds, n)
                rows.append(r)
                art = c.get_artifact(ds["artifact_id"])
                floor_dir = Path(art["uri"].removeprefix("file://"))
                if not a.quick:  # the floor's first half, before the job (tokenizer_floor)
                    extra["floor"][n] = [tokenizer_floor(floor_dir, qwen3_tokenizer_dir(),
                                                         a.floor_records, part=0, parts=2)]
                r, prep = b.prepare(target["id"], ds, n, a.prepare_workers)
                rows.append(r)
                extra["prepare_tps"][n] = (r["tokens"] or 0) / r["wall_s"] if r["wall_s"] else 0
                mixed = art["meta"]
                note += (f"; mix: {ds['num_records']:,} records, "
                         f"{sum(x['duplicates_dropped'] for x in mixed.get('sources', []))} "
                         f"deduplicated; plan ok={plan.get('ok')}")
                extra.setdefault("plans", {})[n] = plan.get("time_estimates")
            if not a.quick:
                if "mix" in stages:  # and its second half, after
                    extra["floor"][n].append(tokenizer_floor(
                        floor_dir, qwen3_tokenizer_dir(), a.floor_records, part=1, parts=2))
                if n <= a.hf_max:
                    extra["hf"][n] = hf_baseline([folder / s.file for s in srcs], tmp)
            for rr in rows[first:]:
                prev = [x for x in rows[:first] if x["stage"] == rr["stage"]]
                if prev:
                    rr["k"] = k_between(prev[-1]["n"], prev[-1]["wall_s"], n, rr["wall_s"])
            print_table(rows[first:])
            print(note, flush=True)
            print("# ingest jobs " + json.dumps(rows[first]["jobs"]), flush=True)
            print("# rows " + json.dumps(rows[first:], default=str), flush=True)
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        if rss is not None:
            rss.stop()
        stack.close()
        shutil.rmtree(tmp, ignore_errors=True)
    report(rows, extra, sizes)


def _floor(halves: list[tuple[int, float, int]]) -> tuple[float, int]:
    """(tokens/s, records) of the floor's parts together."""
    spent = sum(s for _t, s, _u in halves)
    return (sum(t for t, _s, _u in halves) / spent if spent else 0.0,
            sum(u for _t, _s, u in halves))


def report(rows: list[dict], extra: dict, sizes: list[int]) -> None:
    print()
    print_table(rows)
    out = []
    for stage in DATA_STAGES:
        pts = [(r["n"], r["wall_s"]) for r in rows if r["stage"] == stage]
        k = k_fit(pts)
        if k is not None and stage != "plan":
            out.append({"bench": "scale", "metric": f"{stage}_time_growth_k", "value": round(k, 3),
                        "baseline": 1.0, "ratio": round(k, 3), "target": 1.1, "pass": k <= 1.1})
    for stage in STREAMING:
        by = {r["n"]: r["rss_mb"] for r in rows if r["stage"] == stage}
        lo = min((n for n in by if n >= 50_000), default=None)
        hi = max(by, default=None)
        if lo and hi and hi > lo and by[lo]:
            ratio = by[hi] / by[lo]
            out.append({"bench": "scale", "metric": f"{stage}_rss_growth_{fmt_n(lo)}_to_{fmt_n(hi)}",
                        "value": round(by[hi], 1), "baseline": round(by[lo], 1),
                        "ratio": round(ratio, 3), "target": 1.25, "pass": ratio <= 1.25})
    worst = max(r["rows"]["job_events"] / max(1, r["rows"]["jobs"]) - r["wall_s"] - 20
                for r in rows)
    out.append({"bench": "scale", "metric": "events_per_job_beyond_1_per_s", "value": round(worst, 1),
                "baseline": 0, "ratio": None, "target": 0, "pass": worst <= 0})
    top = max(sizes)
    plane = max(r["rss_mb"] for r in rows if r["n"] == top)
    wall = sum(r["wall_s"] for r in rows if r["n"] == top)
    out.append({"bench": "scale", "metric": f"data_plane_peak_rss_mb_{fmt_n(top)}",
                "value": round(plane, 1), "baseline": 3000, "ratio": round(plane / 3000, 3),
                "target": 1.0, "pass": plane < 3000, "wall_s": round(wall, 1)})
    if top in extra["floor"]:
        floor_tps, used = _floor(extra["floor"][top])
        tps = extra["prepare_tps"][top]
        out.append({"bench": "scale", "metric": f"prepare_vs_tokenizer_floor_{fmt_n(top)}",
                    "value": round(tps), "baseline": round(floor_tps), "ratio": round(tps / floor_tps, 3),
                    "target": 0.75, "pass": tps / floor_tps >= 0.75, "floor_records": used})
    for n, (hf_s, hf_rss) in sorted(extra["hf"].items()):
        ing = next(r for r in rows if r["stage"] == "ingest" and r["n"] == n)
        ratio = hf_s / ing["wall_s"]
        print(f"ingest N={fmt_n(n)}: {ing['wall_s']:.1f} s vs HF datasets {hf_s:.1f} s "
              f"(peak RSS {hf_rss:.0f} MB): {ratio:.2f}x")
        if n == max(extra["hf"]):
            out.append({"bench": "scale", "metric": f"ingest_speedup_vs_hf_datasets_{fmt_n(n)}",
                        "value": round(ing["wall_s"], 2), "baseline": round(hf_s, 2),
                        "ratio": round(ratio, 3), "target": 1.5, "pass": ratio >= 1.5})
    for n, halves in sorted(extra["floor"].items()):
        floor_tps, used = _floor(halves)
        print(f"prepare N={fmt_n(n)}: {extra['prepare_tps'][n] / 1e6:.3f} M tok/s vs floor "
              f"{floor_tps / 1e6:.3f} M tok/s on {used} records (before the job "
              + ", after ".join(f"{t / s / 1e6:.3f}" for t, s, _ in halves if s) + ")")
    for r in rows:
        if r.get("eta", {}).get("eta_error") is not None:
            e = r["eta"]
            print(f"ETA {r['stage']} N={fmt_n(r['n'])} ({e['phase']} phase) at 10%: "
                  f"{e['eta_s']:.0f} s shown, {e['remained_s']:.0f} s remained: error "
                  f"{e['eta_error']:.0%} ({e['progress_events']} progress events)")
    etas = [r for r in rows if r["n"] == max(sizes) and r.get("eta", {}).get("eta_error")
            is not None]
    for r in etas:
        err = r["eta"]["eta_error"]
        out.append({"bench": "scale", "metric": f"{r['stage']}_eta_error_at_10pct_{fmt_n(r['n'])}",
                    "value": err, "baseline": r["eta"]["remained_s"], "ratio": err,
                    "target": 0.25, "pass": err <= 0.25})
    for n, t in sorted(extra.get("plans", {}).items()):
        prep = next((s for s in (t or {}).get("stages", []) if s["stage"] == "prepare"), None)
        meas = next(r for r in rows if r["stage"] == "prepare" and r["n"] == n)
        if prep:
            print(f"plan N={fmt_n(n)}: prepare estimated {prep['wall_hours'] * 3600:.0f} s "
                  f"({prep['basis']}), measured {meas['wall_s']:.0f} s")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
