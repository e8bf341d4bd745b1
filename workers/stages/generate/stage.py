"""The `generate` stage: dataset + target -> dataset whose assistant turns are the target's.

    inputs  {"dataset": <dataset artifact>, "target": <resolved target>} (contracts/resolved.py)
    params  contracts/generate.py
    output  artifact "dataset" (kind dataset): data.parquet (records.py layout, same ids and
            sources, system/user/tool turns kept, answered assistant turns replaced, the
            generated reasoning in `reasoning`), token_ids.parquet (per generated turn: id,
            turn, prompt_ids, completion_ids, finish_reason), failures.jsonl ({"id", "line",
            "source", "reason", "message"}; also in the job folder, kept when the job fails),
            chat_template.jinja (the template used), meta.json.

Count in = count out + count failed, checked before the artifact is declared.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from contracts.generate import GenerateParams
from contracts.resolved import GenerateResolved, ResolvedArtifact, ResolvedTarget
from contracts.target import text_value
from workers.stages.common import StageContext, StageError
from workers.stages.failures import FailureLog
from workers.stages.generate.backends.base import GenerateBackend, SamplingConfig
from workers.stages.generate.render import PromptRenderer
from workers.stages.generate.runner import Runner, RunState, check_failure_budget
from workers.stages.generate.shards import (
    FAILURES_FILE,
    ShardStore,
    assemble,
    fingerprint_of,
)
from workers.stages.kernel import input_error, publish
from workers.stages.records import DATA_FILE, TOKEN_IDS_FILE, iter_records

ARTIFACT = "dataset"
TEMPLATE_FILE = "chat_template.jinja"
# Bumped when the output for the same inputs and params changes: shards of an older
# version are then not resumed from.
OUTPUT_VERSION = 1


def resolve_backend(choice: str) -> str:
    """auto: vLLM when there is a GPU and a vLLM (importable here, or configured for the
    server), else transformers."""
    if choice != "auto":
        return choice
    import torch

    from workers.stages.vllm_server import vllm_installed

    return "vllm" if torch.cuda.is_available() and vllm_installed() else "hf"


def _check_dataset(ds: ResolvedArtifact) -> None:
    if not (Path(ds.path) / DATA_FILE).is_file():
        raise input_error("inputs.dataset.path", f"no {DATA_FILE} in {ds.path}")


def _load_renderer(target: ResolvedTarget, p: GenerateParams) -> PromptRenderer:
    from transformers import AutoTokenizer

    tok_path = target.tokenizer
    try:
        tok = AutoTokenizer.from_pretrained(tok_path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise StageError("invalid_target", f"cannot load the tokenizer at {tok_path}: {e}") from e
    try:
        return PromptRenderer.for_target(tok, target, p.chat_template, p.chat_template_kwargs)
    except ValueError as e:  # the tokenizer has no chat template and none was given
        raise StageError("invalid_target", f"no chat template: {e}") from e


def eos_token_ids(target: ResolvedTarget, tokenizer) -> tuple[int, ...]:
    """The tokenizer's EOS plus the model's generation_config eos ids (Qwen3 lists both
    <|im_end|> and <|endoftext|>), so both backends stop on the same tokens."""
    ids: list[int] = []
    gen_cfg = Path(target.path) / "generation_config.json"
    sources = []
    if gen_cfg.is_file():
        import json

        sources.append(json.loads(gen_cfg.read_text()).get("eos_token_id"))
    sources += [target.config.get("eos_token_id"), tokenizer.eos_token_id]
    for s in sources:
        for i in (s if isinstance(s, list) else [s]):
            if isinstance(i, int) and i not in ids:
                ids.append(i)
    if not ids:
        raise StageError("invalid_target", "the target defines no EOS token")
    return tuple(ids)


def config_context_len(config: dict | None) -> int | None:
    n = text_value(config, "max_position_embeddings")
    return n if isinstance(n, int) else None


def _input_ids(path: str) -> list[str]:
    ids = pq.read_table(Path(path) / DATA_FILE, columns=["id"]).column("id").to_pylist()
    if len(set(ids)) != len(ids):
        dups = sorted(i for i, n in Counter(ids).items() if n > 1)[:10]
        raise input_error("inputs.dataset", "has duplicate record ids, which resuming by id "
                          "cannot handle", examples=dups)
    return ids


def _check_gpus(p: GenerateParams) -> None:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    want = p.vllm.tensor_parallel_size * p.vllm.data_parallel_size
    if visible and want > len(visible.split(",")):
        raise StageError("invalid_params", f"params.vllm: tensor_parallel_size x "
                         f"data_parallel_size = {want} GPUs, but the job holds "
                         f"{len(visible.split(','))} ({visible})")


def make_backend(name: str, target: ResolvedTarget, renderer: PromptRenderer, sampling: SamplingConfig,
                 p: GenerateParams, work_dir: Path) -> GenerateBackend:
    if name == "hf":
        from workers.stages.generate.backends.hf import HFBackend

        return HFBackend(target.path, renderer.tokenizer, sampling, p.batch_size)
    from workers.stages.generate.backends.vllm import VllmBackend

    _check_gpus(p)
    return VllmBackend(target.path, target.tokenizer_path, sampling, p.vllm, work_dir,
                       context_len=config_context_len(target.config))


def run(p: GenerateParams, inputs: GenerateResolved, ctx: StageContext) -> dict:
    t_start = time.monotonic()
    ds, target = inputs.dataset, inputs.target
    _check_dataset(ds)
    renderer = _load_renderer(target, p)
    backend_name = resolve_backend(p.backend)
    sampling = SamplingConfig(temperature=p.temperature, top_p=p.top_p, max_tokens=p.max_tokens,
                              seed=p.seed, stop=tuple(p.stop),
                              eos_token_ids=eos_token_ids(target, renderer.tokenizer))
    input_ids = _input_ids(ds.path)
    total = len(input_ids)

    store = ShardStore(ctx.work_dir / "generate")
    fingerprint = fingerprint_of({
        "version": OUTPUT_VERSION, "dataset": ds.path, "target": target.path,
        "template": renderer.sha256, "kwargs": renderer.kwargs, "backend": backend_name,
        "params": p.model_dump(exclude={"max_failure_share": True, "shard_records": True,
                                        "vllm": {"concurrency", "port", "startup_timeout_s",
                                                 "request_timeout_s", "max_attempts"}}),
    })
    if not store.open(fingerprint):
        ctx.warning("discarded the shards of an earlier attempt with other inputs or params")
    done, failed_before = store.done()
    resumed = len(done)
    failures = FailureLog(ctx.work_dir / FAILURES_FILE)
    for row in store.failed_rows():
        failures.add(row["id"], row["failure"], row["failure_detail"], row["source"])
    state = RunState(total=total, done=resumed, failed=failed_before)
    ctx.progress(resumed, total, "records", stage="generate", force=True)

    if resumed < total:
        backend = make_backend(backend_name, target, renderer, sampling, p, ctx.work_dir)
        try:
            window = p.shard_records or (8 * p.vllm.concurrency if backend_name == "vllm"
                                         else 4 * p.batch_size)
            todo = ((i, r) for i, r in enumerate(iter_records(ds.path))
                    if r["id"] not in done)
            Runner(backend, renderer, p, store, ctx, state,
                   backend.context_len, failures).run(todo, window)
        finally:
            backend.close()
            failures.close()

    folder = ctx.out_dir / ARTIFACT
    out = assemble(store, folder)
    # Count in = count out + count failed: every input id exactly once (assemble dedupes).
    expected = set(input_ids)
    if out.ids != expected or out.num_records + out.num_failed != total:
        raise StageError("internal_error", "the output does not hold every input record once",
                         {"missing": len(expected - out.ids),
                          "unexpected": len(out.ids - expected)})
    failures.close()
    failures.copy_to(folder)
    (folder / TEMPLATE_FILE).write_text(renderer.template, encoding="utf-8")
    meta = _meta(p, ds, target, renderer, backend_name, out, state, resumed, t_start)
    meta["failed_sample"] = failures.sample
    check_failure_budget(failures, out.num_failed, total, p.max_failure_share)
    ctx.progress(total, total, "records", stage="generate", force=True)
    ctx.metric(total, tokens_generated=out.tokens_generated,
               tokens_per_s=meta["stats"]["tokens_per_s"])
    publish(ctx, folder, ARTIFACT, "dataset", meta)
    return {"num_records": out.num_records, "num_failed": out.num_failed,
            "failed_by_reason": out.failed_by_reason, "failed_sample": failures.sample[:5],
            "tokens_generated": out.tokens_generated, "backend": backend_name,
            "tokens_per_s": meta["stats"]["tokens_per_s"], "resumed_records": resumed}


def _meta(p: GenerateParams, ds: ResolvedArtifact, target: ResolvedTarget, renderer: PromptRenderer,
          backend_name: str, out, state: RunState, resumed: int, t_start: float) -> dict:
    turns = out.turns_generated
    return {
        "num_records": out.num_records,
        "num_failed": out.num_failed,
        "failed_by_reason": out.failed_by_reason,
        "generation": {
            "target_path": target.path,
            "backend": backend_name,
            "chat_template_sha256": renderer.sha256,
            "chat_template_file": TEMPLATE_FILE,
            "chat_template_kwargs": renderer.kwargs,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "max_tokens": p.max_tokens,
            "seed": p.seed,
            "stop": p.stop,
            "turns": p.turns,
            "max_prompt_tokens": p.max_prompt_tokens,
        },
        "tokens_generated": out.tokens_generated,
        "files": {"data": DATA_FILE, "token_ids": TOKEN_IDS_FILE, "failures": FAILURES_FILE},
        "input": {"path": ds.path, "num_records": out.num_records + out.num_failed},
        "stats": {
            "prompt_tokens": out.prompt_tokens,
            "turns_generated": turns,
            "mean_completion_tokens": round(out.tokens_generated / turns, 2) if turns else 0.0,
            "finish_reasons": out.finish_reasons,
            "resumed_records": resumed,
            # This attempt only (a resumed job's earlier attempts are not timed here).
            "attempt_tokens_generated": state.tokens,
            "generation_s": round(state.gen_seconds, 3),
            "elapsed_s": round(time.monotonic() - t_start, 3),
            "tokens_per_s": round(state.tokens / state.gen_seconds, 1)
            if state.gen_seconds > 0 else 0.0,
        },
    }
