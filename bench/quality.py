"""The quality bench: does a drafter draftyard trains speed up a real model, and how does that
grow with the prompts a team regenerates? (docs/quality.md has the measured tables.)

Through the API of an embedded service, as a team would run it (`make bench-quality`):

1. The real target, SmolLM2-135M-Instruct (`draftyard real-target`: converted once per machine,
   workers/stages/real_target.py), registered by path, and its salvaged prompt files.
2. Short single-turn ShareGPT prompts (at most --max-prompt-chars): the first
   --eval-prompts are the held-out evaluation set, never trained on; the training sets are
   the next N of the rest for each size of --sizes (nested: 20 is inside 40). HumanEval's
   prompts are the second evaluation set.
3. Per size (and, at the smallest, per seed of --seeds) one run naming the drafters of
   --drafters (any type of contracts/drafters.py's registry; DFlash and EAGLE-3 by default,
   docs/compare-drafters.md), each with --spec-tokens speculative tokens. A drafter the
   plan (POST /v1/plans) says the target cannot have (mtp: SmolLM2 has no native MTP
   layers) is not run: its row says "not applicable" with the plan's reason. Each run:
   generate (the target's own greedy answers of
   --answer-tokens), prepare, extract (float32), and per drafter train and evaluate on the
   held-out ShareGPT prompts (`stages.evaluate.data`); then per trained drafter one evaluate
   job on HumanEval. Every evaluate measures greedy speculative decoding (tau, acceptance
   per draft position) of the trained drafter, the untrained one (same config, fresh seeded
   weights) and prompt lookup (vLLM's `ngram`, same speculative tokens).
4. Reuse: the service reuses a finished job whose inputs and params match (its fingerprint,
   docs/ARCHITECTURE.md "Storage"), and the bench keeps its service's home
   (bench/out/quality/ by default) and names its datasets by their content, so the seeds of
   one size share generate/prepare/extract, and a rerun of the bench costs only what changed
   (a new size, another epoch count). Every reused job is printed with where it came from.

Per size and method a table (tau trained / untrained / prompt lookup with the seeds' spread,
acceptance per position, verdict, wall time per stage), the data-size curve (tau per doubling
of the prompts, least squares over log2 N, and the N it would need to reach the target), then
the JSON lines of bench/: DFlash (and EAGLE-3, reported the same way) at the largest size:
tau >= 2.5 on held-out ShareGPT prompts and >= 1.5x prompt lookup's tau.

    python bench/quality.py                                   # sizes 20,40,80; 3 seeds at 20
    python bench/quality.py --sizes 20,40 --seeds 1 --answer-tokens 24 --eval-prompts 4
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._common import result  # noqa: E402
from contracts.drafters import DRAFTERS, drafter_types  # noqa: E402

BENCH = "quality"
# Every registered drafter type can be asked for (contracts/drafters.py, the one list); the
# default is the two the targets below judge.
METHODS = drafter_types()
DEFAULT_METHODS = ("dflash", "eagle3")
EVAL_SETS = ("sharegpt", "humaneval")
STAGES = ("generate", "prepare", "extract", "train", "evaluate", "evaluate_humaneval")
TARGET_TAU = 2.5       # issue target: DFlash on held-out ShareGPT prompts, largest size
TARGET_VS_LOOKUP = 1.5  # ... and at least this many times prompt lookup's tau
TERMINAL = ("succeeded", "failed", "cancelled")


# ---- arguments ---------------------------------------------------------------------------

def _ints(flag: str, text: str, low: int) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"{flag}: a comma-separated list of integers, got {text!r}") from None
    if not vals or any(v < low for v in vals):
        raise SystemExit(f"{flag}: every value must be >= {low}, got {text!r}")
    return vals


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="20,40,80",
                    help="training-set sizes in prompts (at least one; three for a curve)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds at the smallest size")
    ap.add_argument("--answer-tokens", type=int, default=48,
                    help="length of the regenerated answers and of every evaluation")
    ap.add_argument("--eval-prompts", type=int, default=8, help="held-out ShareGPT prompts")
    ap.add_argument("--humaneval-prompts", type=int, default=8, help="HumanEval prompts")
    ap.add_argument("--humaneval-seeds", type=int, default=None,
                    help="how many seeds at the smallest size are also evaluated on HumanEval "
                         "(default: all; each is two evaluate jobs)")
    ap.add_argument("--max-prompt-chars", type=int, default=400,
                    help="ShareGPT prompts longer than this are skipped (keeps prefill short)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--spec-tokens", type=int, default=3,
                    help="speculative tokens (DFlash block = this + 1, EAGLE-3 ttt steps)")
    ap.add_argument("--drafters", default=",".join(DEFAULT_METHODS),
                    help=f"comma-separated, among {', '.join(METHODS)}; one the target cannot "
                         "have (the plan says why) gets a 'not applicable' row")
    ap.add_argument("--home", default=str(REPO / "bench" / "out" / "quality"),
                    help="the service's home, kept between runs for reuse")
    ap.add_argument("--port", type=int, default=int(os.environ.get("DRAFTYARD_BENCH_PORT",
                                                                   "8791")))
    ap.add_argument("--timeout", type=float, default=4 * 3600.0, help="seconds for everything")
    a = ap.parse_args(argv)
    a.sizes = sorted(set(_ints("--sizes", a.sizes, 1)))
    a.drafters = list(dict.fromkeys(d for d in a.drafters.split(",") if d))
    bad = [d for d in a.drafters if d not in METHODS]
    if bad or not a.drafters:
        raise SystemExit(f"--drafters: choose among {', '.join(METHODS)}, got {bad or 'none'}")
    a.humaneval_seeds = a.seeds if a.humaneval_seeds is None else a.humaneval_seeds
    for flag in ("seeds", "humaneval_seeds", "answer_tokens", "eval_prompts", "humaneval_prompts", "epochs",
                 "spec_tokens"):
        if getattr(a, flag) < 1:
            raise SystemExit(f"--{flag.replace('_', '-')}: must be >= 1, got {getattr(a, flag)}")
    if a.draft_vocab < 16:
        raise SystemExit(f"--draft-vocab: must be >= 16, got {a.draft_vocab}")
    return a


# ---- the prompt sets ---------------------------------------------------------------------

def short_prompts(path: Path, max_chars: int) -> list[str]:
    """The file's single-user-turn prompt records (JSON lines) of at most `max_chars`
    characters, in file order. Lines split on "\\n" only: prompts hold U+2028."""
    out = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            msgs = rec.get("messages") or []
            if msgs and len(msgs[0].get("content") or "") <= max_chars:
                out.append(line.rstrip("\n"))
    return out


def prompt_sets(lines: list[str], eval_n: int, sizes: list[int]) -> dict[str, list[str]]:
    """{"heldout": the first eval_n, "train-<N>": the next N of the rest, per size}: nested
    training sets, none sharing a prompt with the held-out one."""
    need = eval_n + max(sizes)
    if len(lines) < need:
        raise SystemExit(f"--sizes/--eval-prompts: {need} short prompts needed, the file has "
                         f"{len(lines)} (raise --max-prompt-chars or lower the sizes)")
    rest = lines[eval_n:]
    return {"heldout": lines[:eval_n], **{f"train-{n}": rest[:n] for n in sizes}}


def content_name(kind: str, lines: list[str]) -> str:
    """A dataset's name from its content: the same prompts give the same name, so a rerun
    finds the dataset (and every job downstream of it) again."""
    sha = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:10]
    return f"quality-{kind}-{sha}"


# ---- the numbers -------------------------------------------------------------------------

def spread(vals: list[float]) -> tuple[float, float | None]:
    """(mean, sample standard deviation or None with one value)."""
    m = statistics.fmean(vals)
    return m, (statistics.stdev(vals) if len(vals) > 1 else None)


def fmt_tau(vals: list[float | None]) -> str:
    got = [v for v in vals if v is not None]
    if not got:
        return "-"
    m, sd = spread(got)
    return f"{m:.3f}" + (f"+-{sd:.3f}" if sd is not None else "") + (
        f" ({len(got)} seeds)" if len(got) > 1 else "")


def curve(points: list[tuple[int, float]], goal: float) -> dict[str, Any] | None:
    """Least squares of tau over log2(N): tau per doubling of the prompts, and the N at
    which the line reaches `goal` (None when it does not rise)."""
    pts = [(math.log2(n), t) for n, t in points]
    if len({x for x, _ in pts}) < 2:
        return None
    mx = statistics.fmean(x for x, _ in pts)
    my = statistics.fmean(t for _, t in pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (t - my) for x, t in pts) / sxx
    icpt = my - slope * mx
    need = 2 ** ((goal - icpt) / slope) if slope > 0 else None
    return {"per_doubling": slope, "intercept": icpt, "goal": goal, "prompts_for_goal": need}


def mean_positions(rows: list[list[float]]) -> list[float]:
    rows = [r for r in rows if r]
    if not rows:
        return []
    k = min(len(r) for r in rows)
    return [statistics.fmean(r[i] for r in rows) for i in range(k)]


def size_table(n: int, method: str, cells: list[dict], walls: dict[str, list[float | None]],
               reused: dict[str, int]) -> str:
    """One size and method: per evaluation set tau trained / untrained / prompt lookup (the
    seeds' spread), acceptance per position, the verdicts; then wall time per stage."""
    out = [f"\n== N={n} prompts, {method} ({len({c['seed'] for c in cells})} seed(s))",
           f"{'eval set':<10} {'tau trained':>26} {'untrained':>14} {'prompt lookup':>14} "
           f"{'accept/pos (trained)':>22}  verdict"]
    for es in EVAL_SETS:
        cs = [c for c in cells if c["eval_set"] == es]
        if not cs:
            continue
        pos = mean_positions([c["per_position"] for c in cs])
        verdicts = sorted({c["verdict"] or "-" for c in cs})
        out.append(f"{es:<10} {fmt_tau([c['tau'] for c in cs]):>26} "
                   f"{fmt_tau([c['tau_baseline'] for c in cs]).split(' ')[0]:>14} "
                   f"{fmt_tau([c['tau_prompt_lookup'] for c in cs]).split(' ')[0]:>14} "
                   f"{' '.join(f'{p:.2f}' for p in pos):>22}  {'/'.join(verdicts)}")
    out.append("wall s:   " + "  ".join(
        f"{st} {_wall_text(walls.get(st, []), reused.get(st, 0))}" for st in STAGES
        if walls.get(st) or reused.get(st)))
    return "\n".join(out)


def _wall_text(vals: list[float | None], reused: int) -> str:
    got = [v for v in vals if v is not None]
    text = "/".join(f"{v:.0f}" for v in got) if got else ""
    if reused:
        text += ("+" if text else "") + f"{reused} reused"
    return text or "-"


def json_lines(cells: list[dict], sizes: list[int], methods: list[str],
               na: dict[str, str] | None = None) -> list[dict]:
    """The bench/ JSON results: per method at the largest size, on held-out ShareGPT, tau
    against the 2.5 target and against 1.5x prompt lookup; the curve's tau per doubling. A
    method the target cannot have (`na`: its plan reason) gets one line, judged neither way
    (`pass` None), with the reason."""
    out: list[dict] = []
    big = max(sizes)
    for m in methods:
        if na and m in na:
            out.append({"bench": BENCH, "metric": f"{m}_tau_sharegpt_{big}", "value": None,
                        "baseline": None, "ratio": None, "target": TARGET_TAU, "pass": None,
                        "not_applicable": na[m]})
            continue
        cs = [c for c in cells if c["method"] == m and c["n"] == big and c["eval_set"] ==
              "sharegpt" and c["tau"] is not None]
        if not cs:
            out.append({"bench": BENCH, "metric": f"{m}_tau_sharegpt_{big}", "value": None,
                        "baseline": None, "ratio": None, "target": TARGET_TAU,
                        "pass": False})
            continue
        tau = statistics.fmean(c["tau"] for c in cs)
        pl = statistics.fmean(c["tau_prompt_lookup"] or 0.0 for c in cs)
        out.append({"bench": BENCH, "metric": f"{m}_tau_sharegpt_{big}", "value": round(tau, 4),
                    "baseline": 1.0, "ratio": round(tau, 4), "target": TARGET_TAU,
                    "pass": tau >= TARGET_TAU})
        out.append(result(BENCH, f"{m}_tau_vs_prompt_lookup_sharegpt_{big}", tau, pl,
                          TARGET_VS_LOOKUP))
        fit = curve(seed_means(cells, m, "sharegpt"), TARGET_TAU)
        if fit is not None:
            out.append({"bench": BENCH, "metric": f"{m}_tau_per_doubling_sharegpt",
                        "value": round(fit["per_doubling"], 4), "baseline": 0.0, "ratio": None,
                        "target": 0.0, "pass": fit["per_doubling"] > 0,
                        "prompts_for_tau_2_5": (None if fit["prompts_for_goal"] is None
                                                else round(fit["prompts_for_goal"]))})
    return out


def seed_means(cells: list[dict], method: str, eval_set: str) -> list[tuple[int, float]]:
    """(N, tau averaged over the seeds) per size, for the curve."""
    by_n: dict[int, list[float]] = {}
    for c in cells:
        if c["method"] == method and c["eval_set"] == eval_set and c["tau"] is not None:
            by_n.setdefault(c["n"], []).append(c["tau"])
    return sorted((n, statistics.fmean(v)) for n, v in by_n.items())


def curve_text(cells: list[dict], methods: list[str]) -> str:
    out = ["\ndata-size curve (tau = a + b log2 N, seeds averaged):"]
    for m in methods:
        for es in EVAL_SETS:
            pts = seed_means(cells, m, es)
            fit = curve(pts, TARGET_TAU)
            line = f"{m:<7} {es:<10} " + "  ".join(f"N={n}: {t:.3f}" for n, t in pts)
            if fit is not None:
                need = fit["prompts_for_goal"]
                line += (f"  | {fit['per_doubling']:+.3f} per doubling; tau {TARGET_TAU} at "
                         + (f"~{need:,.0f} prompts" if need is not None else "never (no rise)"))
            out.append(line)
    return "\n".join(out)


# ---- the service -------------------------------------------------------------------------

def job_wall(j: dict) -> float | None:
    from datetime import datetime

    if j.get("reused_from") or not j.get("started_at") or not j.get("finished_at"):
        return None
    return (datetime.fromisoformat(j["finished_at"]) -
            datetime.fromisoformat(j["started_at"])).total_seconds()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def dataset(c, data: Path, kind: str, lines: list[str]) -> dict:
    """The dataset of these prompt lines: found by its content name, else added."""
    name = content_name(kind, lines)
    for d in c.iter_all("/v1/datasets"):
        if d.get("name") == name and d.get("status") == "ready":
            return d
    f = data / f"{name}.jsonl"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    d = c.wait_dataset(c.add_dataset(name, str(f))["id"], timeout=600)
    if d["status"] != "ready":
        raise RuntimeError(f"dataset {name}: {d['status']}")
    return d


def target(c, folder: Path) -> dict:
    from app.cli.real_target import CHAT_KWARGS, TARGET_NAME

    for t in c.iter_all("/v1/targets"):
        if t.get("name") == TARGET_NAME and t.get("path") == str(folder):
            return t
    return c.create_target(TARGET_NAME, str(folder), chat_template_kwargs=CHAT_KWARGS)


def spec_option(method: str, spec_tokens: int) -> dict[str, int]:
    """The option of a drafter type that sets its speculative tokens, read off its options
    model (contracts/drafters.py): the integer field whose +1 moves `speculative_tokens()`
    by +1 (DFlash's block_size = tokens + 1, EAGLE-3's ttt_steps = tokens, ...)."""
    opts = DRAFTERS[method].options
    base = opts()
    for name, f in opts.model_fields.items():
        default = getattr(base, name)
        if f.annotation is not int or not isinstance(default, int):
            continue
        if opts(**{name: default + 1}).speculative_tokens() == base.speculative_tokens() + 1:
            return {name: spec_tokens - base.speculative_tokens() + default}
    raise ValueError(f"{method}: no option sets its speculative tokens")


def drafter_entries(a: argparse.Namespace, methods: list[str] | None = None) -> list[dict]:
    return [{"type": m, "name": m, "num_layers": 1, "draft_vocab_size": a.draft_vocab,
             **spec_option(m, a.spec_tokens)}
            for m in (a.drafters if methods is None else methods)]


def not_applicable(plan: dict, methods: list[str]) -> dict[str, str]:
    """{method: the plan's reason} for each drafter the plan (POST /v1/plans) says the target
    cannot have (its failed `drafter_params:<name>` check, workers/stages/plan.py); any other
    failed check stops the bench with the plan's messages."""
    failed = {c["name"]: c["message"] for c in plan.get("checks") or [] if not c.get("ok")}
    out = {m: failed.pop(f"drafter_params:{m}") for m in methods
           if f"drafter_params:{m}" in failed}
    if failed:
        raise SystemExit("the plan refuses the run: " + "; ".join(
            f"{k}: {v}" for k, v in failed.items()))
    return out


def eval_params(a: argparse.Namespace, n_prompts: int, seed: int) -> dict:
    return {"num_prompts": n_prompts, "max_new_tokens": a.answer_tokens,
            "measures": ["specdec"], "seed": seed}


def priority(a: argparse.Namespace, n: int) -> int:
    """Larger sizes first: theirs is the longest chain of stages (the bench's critical path),
    and the smaller sizes' jobs fill the slots around it."""
    return min(50 + 10 * a.sizes.index(n), 100)


def run_body(a: argparse.Namespace, tgt: str, ds: str, heldout: str, n: int, seed: int,
             methods: list[str] | None = None) -> dict:
    return {"name": f"quality-{n}-s{seed}", "target_id": tgt, "dataset_id": ds,
            "priority": priority(a, n),
            "drafters": drafter_entries(a, methods), "mode": "offline",
            # Keep the hidden states (a few MB here): retention removes an offline run's once
            # its trains succeed (app/storage/retention.py), and a rerun of the bench would
            # then extract and train again instead of reusing them.
            "keep": True,
            "stages": {"generate": {"backend": "hf", "max_tokens": a.answer_tokens,
                                    "temperature": 0.0, "batch_size": 16},
                       "prepare": {"seq_length": 512},
                       "extract": {"dtype": "float32", "backend": "hf"},
                       "train": {"epochs": a.epochs, "seq_length": 512, "seed": seed,
                                 "log_every": 1},
                       "evaluate": {**eval_params(a, a.eval_prompts, seed), "data": heldout}}}


def measure(c, a: argparse.Namespace, tgt: dict, sets: dict[str, dict], humaneval: dict,
            deadline: float, methods: list[str]) -> tuple[list[dict], list[dict]]:
    """Submit every run naming `methods` (the service queues them on its CPU slots), then
    follow them; each trained drafter also gets its HumanEval evaluate. Answers (cells, job
    rows)."""
    # The first seed of every size at once; the other seeds of the smallest once its shared
    # stages (generate, prepare, extract) have succeeded: a job reuses only a finished job,
    # so two identical ones queued together would both run.
    later = [(a.sizes[0], s) for s in range(1, a.seeds)]
    runs: dict[tuple[int, int], dict] = {}
    submitted: dict[tuple[int, int], float] = {}

    def submit(n: int, s: int) -> None:
        body = run_body(a, tgt["id"], sets[f"train-{n}"]["id"], sets["heldout"]["id"], n, s,
                        methods)
        r = c.create_run(body)
        runs[(n, s)] = r
        submitted[(n, s)] = time.monotonic()
        log(f"run {r['id']}: N={n} seed {s} ({len(r['jobs'])} jobs)")

    for n in a.sizes:
        submit(n, 0)
    he_jobs: dict[tuple[int, int, str], str] = {}
    jobs_of: dict[tuple[int, int], dict[str, dict]] = {}
    pending = set(runs) | set(later)
    while pending:
        if time.time() > deadline:
            raise SystemExit(f"--timeout: runs {sorted(pending)} not finished")
        for key in sorted(pending):
            n, s = key
            if key not in runs:
                first = {j["run_stage"]: j for j in c.list_jobs(
                    run_id=runs[(n, 0)]["id"], limit=100)["data"]}
                if all(j["status"] == "succeeded" for k, j in first.items()
                       if k.split(":")[0] in ("generate", "prepare", "extract")):
                    submit(n, s)
                continue
            js = {j["run_stage"]: j for j in c.list_jobs(run_id=runs[key]["id"], limit=100)["data"]}
            for m in methods if s < a.humaneval_seeds else []:
                tr = js.get(f"train:{m}")
                if tr and tr["status"] == "succeeded" and (n, s, m) not in he_jobs:
                    j = c.submit_job("evaluate", eval_params(a, a.humaneval_prompts, s),
                                     {"target": tgt["id"], "drafter": tr["id"],
                                      "data": humaneval["id"]},
                                     name=f"quality-{n}-s{s}-{m}-humaneval",
                                     priority=priority(a, n))
                    he_jobs[(n, s, m)] = j["id"]
            failed = [k for k, j in js.items() if j["status"] in ("failed", "cancelled")]
            if failed:
                j = js[failed[0]]
                raise RuntimeError(f"N={n} seed {s}: {failed[0]} {j['status']}: {j['error']}")
            done_he = all((n, s, m) in he_jobs and c.get_job(he_jobs[(n, s, m)])["status"]
                          in TERMINAL for m in methods if s < a.humaneval_seeds)
            if js and all(j["status"] == "succeeded" for j in js.values()) and done_he:
                pending.discard(key)
                jobs_of[key] = js
                log(f"N={n} seed {s}: done {time.monotonic() - submitted[key]:.0f} s after "
                    f"submission; " + reuse_text(js, c, he_jobs, key, methods))
        time.sleep(5)
    cells, rows = [], []
    for (n, s), js in sorted(jobs_of.items()):
        for m in methods:
            evals = [("sharegpt", js[f"evaluate:{m}"])]
            if (n, s, m) in he_jobs:
                evals.append(("humaneval", c.get_job(he_jobs[(n, s, m)])))
            for es, j in evals:
                if j["status"] != "succeeded":
                    raise RuntimeError(f"N={n} seed {s} {m} {es}: {j['status']}: {j['error']}")
                meta = c.get_artifact(j["outputs"][0])["meta"]
                cells.append({"n": n, "seed": s, "method": m, "eval_set": es,
                              "tau": meta.get("tau"), "tau_baseline": meta.get("tau_baseline"),
                              "tau_prompt_lookup": meta.get("tau_prompt_lookup"),
                              "per_position": meta.get("acceptance_rate_per_position") or [],
                              "verdict": meta.get("verdict"),
                              "verdict_reason": meta.get("verdict_reason")})
        for stage_key, j in js.items():
            rows.append({"n": n, "seed": s, "key": stage_key, "wall_s": job_wall(j),
                         "reused_from": j.get("reused_from")})
        for m in [m for m in methods if (n, s, m) in he_jobs]:
            j = c.get_job(he_jobs[(n, s, m)])
            rows.append({"n": n, "seed": s, "key": f"evaluate_humaneval:{m}",
                         "wall_s": job_wall(j), "reused_from": j.get("reused_from")})
    return cells, rows


def reuse_text(js: dict[str, dict], c, he_jobs: dict, key: tuple[int, int],
               drafters: list[str]) -> str:
    reused = [k for k, j in js.items() if j.get("reused_from")]
    reused += [f"evaluate_humaneval:{m}" for m in drafters
               if (*key, m) in he_jobs and c.get_job(he_jobs[(*key, m)]).get("reused_from")]
    walls = [w for j in js.values() if (w := job_wall(j)) is not None]
    return (f"reused {', '.join(sorted(reused))}" if reused else "nothing reused") + (
        f"; {sum(walls):.0f} s of stage time run" if walls else "; no stage ran")


def report(cells: list[dict], rows: list[dict], a: argparse.Namespace,
           na: dict[str, str] | None = None) -> list[dict]:
    """The tables, curve and JSON lines; `na` (method: the plan's reason) are the drafters the
    target cannot have, each printed as a 'not applicable' row instead of a table."""
    na = na or {}
    for n in a.sizes:
        for m in a.drafters:
            if m in na:
                print(f"\n== N={n} prompts, {m}: not applicable: {na[m]}")
                continue
            walls: dict[str, list[float | None]] = {}
            reused: dict[str, int] = {}
            for r in rows:
                stage, _, who = r["key"].partition(":")
                if r["n"] != n or (who and who != m):
                    continue
                if r["reused_from"]:
                    reused[stage] = reused.get(stage, 0) + 1
                else:
                    walls.setdefault(stage, []).append(r["wall_s"])
            print(size_table(n, m, [c for c in cells if c["n"] == n and c["method"] == m],
                             walls, reused))
    print(curve_text(cells, [m for m in a.drafters if m not in na]))
    rejected = [c for c in cells if c["verdict"] == "reject"]
    if rejected:
        c = rejected[0]
        print(f"\na rejected drafter (N={c['n']}, seed {c['seed']}, {c['method']}, "
              f"{c['eval_set']}): {c['verdict_reason']}")
    print("# cells " + json.dumps([{k: v for k, v in c.items() if k != "verdict_reason"}
                                   for c in cells]))
    out = json_lines(cells, a.sizes, a.drafters, na)
    print(json.dumps(out))
    return out


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    home = Path(a.home).resolve()
    data = home / "data"
    data.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    from app.cli.real_target import prepare

    folder, counts = prepare(data / "real_prompts", log=lambda m: log(str(m)))
    assert counts is not None
    os.environ.update({"DRAFTYARD_HOME": str(home / "service"),
                       "DRAFTYARD_MODEL_ROOTS": str(folder.parent),
                       "DRAFTYARD_DATA_ROOTS": str(data),
                       "DRAFTYARD_CPU_SLOTS": os.environ.get("DRAFTYARD_CPU_SLOTS", "2")})
    from app.cli.embedded import start_embedded, stop
    from app.core.config import get_settings
    from draftyard import Client

    get_settings.cache_clear()
    proc = start_embedded(a.port)
    try:
        token = (home / "service" / "admin_token").read_text().strip()
        with Client(f"http://127.0.0.1:{a.port}", token, timeout=600) as c:
            tgt = target(c, folder)
            lines = short_prompts(Path(counts["sharegpt"]["path"]), a.max_prompt_chars)
            sets = {k: dataset(c, data, k, v)
                    for k, v in prompt_sets(lines, a.eval_prompts, a.sizes).items()}
            he_lines = [x for x in Path(counts["humaneval"]["path"]).read_text(
                encoding="utf-8").split("\n") if x.strip()]
            humaneval = dataset(c, data, "humaneval", he_lines)
            log(f"target {tgt['id']}; held-out {sets['heldout']['id']} "
                f"({a.eval_prompts} prompts), HumanEval {humaneval['id']} "
                f"({a.humaneval_prompts} of {len(he_lines)} prompts); sizes {a.sizes}, "
                f"{a.seeds} seed(s) at {a.sizes[0]}, {a.answer_tokens}-token answers, "
                f"{a.epochs} epochs")
            # One plan of a run naming every asked drafter: the ones the target cannot have
            # (e.g. mtp without native MTP layers) are reported with its reason, not run.
            na = not_applicable(c.plan(run_body(a, tgt["id"], sets[f"train-{a.sizes[0]}"]["id"],
                                                sets["heldout"]["id"], a.sizes[0], 0)),
                                a.drafters)
            for m, why in na.items():
                log(f"{m}: not applicable: {why}")
            methods = [m for m in a.drafters if m not in na]
            cells, rows = (measure(c, a, tgt, sets, humaneval, t0 + a.timeout, methods)
                           if methods else ([], []))
    finally:
        stop(proc)
    log(f"bench done in {time.time() - t0:.0f} s")
    report(cells, rows, a, na)


if __name__ == "__main__":
    main()
