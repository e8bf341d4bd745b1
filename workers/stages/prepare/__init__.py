"""Stage `prepare`: dataset + target (tokenizer, chat template) -> tokenized set.

    inputs  dataset: a dataset artifact (records.py layout)  contracts/resolved.py
            target:  the resolved target (tokenizer, chat template, config)
    params  PrepareParams (contracts/prepare.py)
    output  artifact "tokenized" (kind `tokenized`), layout in writer.py

Every record either becomes rows or one line of `rejects.jsonl` with a stable reason
(needs_generate, template_error, mask_locate_failed, self_check_failed, empty_turns, too_long,
too_few_valid_tokens, token_ids_mismatch). A record the generate stage answered, in a dataset
generated with this template setup, becomes rows of the token ids the target was given and
produced (tokenrows.py: one row, or one per generated turn whose context the template did not
keep); any other record becomes one row of the rendered text whose mask passed the
self-check (masks.py). The meta counts the rows of each kind. A template that does not
compile fails the job at once (`template_error`, with the Jinja message and line); a dataset
generated with another template or other template kwargs is refused (`template_mismatch`);
more than `max_reject_share` rejected fails the job (`too_many_rejects`).
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from contracts.prepare import PrepareParams
from contracts.resolved import PrepareResolved, ResolvedArtifact, ResolvedTarget
from workers.stages.common import StageContext, StageError
from workers.stages.failures import FailureLog
from workers.stages.kernel import input_error, publish
from workers.stages.prepare.masks import (
    Masker,
    build_masker,
    generation_eos_ids,
    load_tokenizer,
    tokenize_batch,
    tokenize_record,
)
from workers.stages.prepare.pool import (
    STAT_KEYS,
    Chunk,
    ChunkResult,
    MaskerConfig,
    adopt_masker,
    run_chunks,
)
from workers.stages.prepare.spans import RecordRejected
from workers.stages.prepare.templates import check_template, resolve_template_text, template_sha256
from workers.stages.prepare.tokenrows import TokenIndex
from workers.stages.prepare.vocab import (
    TokenCounter,
    save_token_freq,
    save_vocab_mapping,
    target_vocab_size,
)
from workers.stages.prepare.writer import TokenizedWriter, length_percentiles
from workers.stages.records import TOKEN_IDS_FILE, count_records, iter_batches

__all__ = ["run", "tokenize_record", "tokenize_batch", "check_template", "build_masker",
           "RecordRejected", "template_sha256", "resolve_setup", "Masker"]

ARTIFACT = "tokenized"
REJECTS_FILE = "rejects.jsonl"


def usable_cores() -> int:
    """The cores this process may run on (prepare's pool size when num_workers is unset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def resolve_setup(target: ResolvedTarget, params: PrepareParams):
    """(tokenizer, template text, effective kwargs) for a target and params; fails the job
    on a template that does not compile."""
    tok_path = target.tokenizer
    if not Path(tok_path).is_dir():
        raise input_error("inputs.target.tokenizer_path", f"is not a folder: {tok_path}")
    try:
        tokenizer = load_tokenizer(tok_path)
    except (OSError, ValueError) as e:
        raise input_error("inputs.target.tokenizer_path",
                          f"cannot load the tokenizer at {tok_path}: {e}") from None
    text = resolve_template_text(tokenizer, params.chat_template or target.chat_template)
    err = check_template(text)
    if err is not None:
        raise StageError("template_error", err)
    kwargs = {**target.chat_template_kwargs, **params.chat_template_kwargs}
    return tokenizer, str(tok_path), text, kwargs


def _check_generation_meta(meta: dict, sha: str, kwargs: dict, params: PrepareParams,
                           ctx: StageContext) -> bool:
    """A dataset from the generate stage must be rendered as it was generated. True when
    the dataset was generated with this template setup."""
    gen = (meta or {}).get("generation")
    if not gen:
        return False
    problems = []
    if gen.get("chat_template_sha256") and gen["chat_template_sha256"] != sha:
        problems.append(f"chat template sha256 {gen['chat_template_sha256'][:12]}... at "
                        f"generation, {sha[:12]}... here")
    if "chat_template_kwargs" in gen and (gen.get("chat_template_kwargs") or {}) != kwargs:
        problems.append(f"chat_template_kwargs {gen.get('chat_template_kwargs')} at generation, "
                        f"{kwargs} here")
    if not problems:
        return True
    msg = "the dataset was generated with another template setup: " + "; ".join(problems)
    if not params.allow_template_mismatch:
        raise StageError("template_mismatch", msg + " (params.allow_template_mismatch=true "
                         "to prepare anyway)", details={"problems": problems})
    ctx.warning(msg + "; the text is re-rendered with this setup, the generated token ids "
                "are not used")
    return False


def _token_index(dataset: ResolvedArtifact, same_setup: bool, params: PrepareParams
                 ) -> TokenIndex | None:
    """The generated turns' token ids, when rows are to be built from them."""
    name = (dataset.meta.get("files") or {}).get("token_ids") or TOKEN_IDS_FILE
    path = Path(dataset.path) / name
    if not (params.use_token_ids and same_setup and path.is_file()):
        return None
    try:
        return TokenIndex.load(path)
    except (OSError, ValueError) as e:
        raise input_error("inputs.dataset.path", f"cannot read the generated token ids "
                          f"{path}: {e}") from None


def _chunks(folder: str, per_task: int, limit: int | None, tokens: TokenIndex | None
            ) -> Iterator[Chunk]:
    """The dataset's rows, `per_task` a task (fewer at a row group's end), the first `limit`."""
    left = limit
    for batch in iter_batches(folder, max(per_task, 256)):
        if left is not None:
            batch = batch.slice(0, left)
            left -= batch.num_rows
        for start in range(0, batch.num_rows, per_task):
            part = batch.slice(start, per_task)
            turns = None
            if tokens is not None:
                turns = {k: t for k, rid in enumerate(part.column("id").to_pylist())
                         if (t := tokens.turns(str(rid)))}
            yield Chunk.of(part, turns)
        if left == 0:
            return


@dataclass
class _Setup:
    """What every record is rendered and masked with (resolved once, before the pool)."""
    tokenizer: Any
    tok_path: str
    sha: str
    kwargs: dict
    tokens: TokenIndex | None
    now: datetime
    cfg: MaskerConfig
    masker: Masker


def _setup(params: PrepareParams, inputs: PrepareResolved, ctx: StageContext) -> _Setup:
    dataset, target = inputs.dataset, inputs.target
    if not (Path(dataset.path) / "data.parquet").is_file():
        raise input_error("inputs.dataset.path", f"no data.parquet in {dataset.path}")
    tokenizer, tok_path, text, kwargs = resolve_setup(target, params)
    sha = template_sha256(text)
    same_setup = _check_generation_meta(dataset.meta, sha, kwargs, params, ctx)
    tokens = _token_index(dataset, same_setup, params)
    now = datetime.now(timezone.utc).replace(microsecond=0)
    eos_ids = generation_eos_ids(target.path)
    cfg = MaskerConfig(tok_path, text, kwargs, params.train_on, now.isoformat(), eos_ids,
                       params.mask_method, params.seq_length, params.length_policy,
                       params.min_valid_tokens)
    masker = cfg.build(tokenizer)
    adopt_masker(cfg, masker)
    return _Setup(tokenizer, tok_path, sha, kwargs, tokens, now, cfg, masker)


@dataclass
class _Tally:
    """The chunks' results as they come back from the pool: rows to the writer, rejects to
    their log, token counts, lengths and the stats of the meta."""
    writer: TokenizedWriter
    rejects: FailureLog
    counter: TokenCounter
    total: int
    ctx: StageContext
    template_errors: Counter = field(default_factory=Counter)
    lengths: list[np.ndarray] = field(default_factory=list)
    agg: dict[str, int] = field(default_factory=lambda: {
        "done": 0, "masked": 0, "truncated": 0, **dict.fromkeys(STAT_KEYS, 0)})

    def add(self, res: ChunkResult) -> None:
        self.writer.write(res.batch())
        for rid, src, reason, detail in res.rejects:
            self.rejects.add(rid, reason, detail, src)
            if reason == "template_error":
                self.template_errors[detail] += 1
        self.counter.add(res.freq_ids, res.freq_counts)
        self.lengths.append(res.lengths)
        agg = self.agg
        agg["done"] += res.n_records
        agg["masked"] += int(res.freq_counts.sum())
        agg["truncated"] += res.truncated
        for k, v in res.stats.items():
            agg[k] += v
        self.ctx.progress(agg["done"], self.total, "records", stage="prepare")


def _check_rejects(tally: _Tally, params: PrepareParams) -> dict:
    """The rejects' summary; fails the job on no rows or more rejects than its budget."""
    rejects, writer, done = tally.rejects, tally.writer, tally.agg["done"]
    n_rej = rejects.count
    # by records: a record of generated turns may give several rows
    share = n_rej / max(1, done)
    summary_rej = {"num_rejected": n_rej, "rejected_by_reason": dict(rejects.by_reason),
                   "rejected_sample": rejects.sample[:5]}
    details = {**summary_rej, **rejects.summary()}
    if writer.num_rows == 0:
        writer.abort()
        raise StageError("empty_output", f"no record could be prepared ({n_rej} rejected: "
                         f"{dict(rejects.by_reason)})", details=details)
    if share > params.max_reject_share:
        writer.abort()
        raise StageError("too_many_rejects",
                         f"{n_rej} of {done} records rejected ({share:.0%} > "
                         f"max_reject_share {params.max_reject_share:.0%}): "
                         f"{dict(rejects.by_reason)}; first: " +
                         ", ".join(f"{f['id']} ({f['reason']})" for f in rejects.sample[:5]),
                         details=details)
    return summary_rej


def run(params: PrepareParams, inputs: PrepareResolved, ctx: StageContext) -> dict:
    t_start = time.perf_counter()
    setup = _setup(params, inputs, ctx)
    total = count_records(inputs.dataset.path)
    if params.max_samples is not None:
        total = min(total, params.max_samples)
    workers = max(1, min(params.num_workers or usable_cores(),
                         -(-total // params.records_per_task) or 1))

    folder = Path(ctx.out_dir) / ARTIFACT
    if folder.exists():  # a retried job starts from a clean folder
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    vocab = max(len(setup.tokenizer), target_vocab_size(inputs.target.config or None, 0))
    # The rejects in the job folder, so the list outlives a job that stops on its budget.
    tally = _Tally(TokenizedWriter(folder), FailureLog(Path(ctx.work_dir) / REJECTS_FILE),
                   TokenCounter(vocab), total, ctx)
    ctx.progress(0, total, "records", stage="prepare", force=True)
    t_work = time.perf_counter()
    try:
        run_chunks(setup.cfg, _chunks(inputs.dataset.path, params.records_per_task,
                                      params.max_samples, setup.tokens), workers, tally.add)
    except BaseException:
        tally.writer.abort()
        raise
    finally:
        tally.rejects.close()
    summary_rej = _check_rejects(tally, params)
    t_write = time.perf_counter()
    tally.writer.finish()
    tally.rejects.copy_to(folder)

    freq = tally.counter.as_dict()
    save_token_freq(folder / "token_freq.pt", freq)
    vocab_files = {}
    if params.draft_vocab_size:
        vsize = target_vocab_size(inputs.target.config or None, len(setup.tokenizer))
        d2t, t2d = save_vocab_mapping(folder, freq, params.draft_vocab_size, vsize)
        vocab_files = {"d2t": d2t.name, "t2d": t2d.name, "target_vocab_size": vsize}
    timings = {"setup": round(t_work - t_start, 3), "tokenize": round(t_write - t_work, 3),
               "write": round(time.perf_counter() - t_write, 3)}
    meta = _meta(params, inputs, setup, tally, summary_rej, vocab_files, workers, timings)
    publish(ctx, folder, ARTIFACT, "tokenized", meta, meta_file="prepare_meta.json")
    if tally.agg["turns_without_end_token"]:
        ctx.warning(f"{tally.agg['turns_without_end_token']} trained turns have no end-of-turn "
                    "token in the rendering (the template emits none there); they train "
                    "without one")
    return {**{k: meta[k] for k in ("num_rows", "num_tokens", "num_masked_tokens",
                                    "num_rejected", "rejected_by_reason", "self_check_failures",
                                    "num_truncated", "mask_method")},
            "failed_sample": tally.rejects.sample[:5]}


def _meta(params: PrepareParams, inputs: PrepareResolved, setup: _Setup, tally: _Tally,
          summary_rej: dict, vocab_files: dict, workers: int, timings: dict) -> dict:
    agg, rejects, tokens = tally.agg, tally.rejects, setup.tokens
    lens = np.concatenate(tally.lengths) if tally.lengths else np.zeros(0, dtype=np.int64)
    return {
        "num_rows": tally.writer.num_rows,
        "num_records_kept": agg["done"] - rejects.count,  # rows come from these records
        "num_tokens": int(lens.sum()),
        "num_masked_tokens": agg["masked"],
        **summary_rej,
        "rejected_sample": rejects.sample,
        "template_errors": dict(sorted(tally.template_errors.items(),
                                       key=lambda kv: -kv[1])[:20]),
        "self_check_failures": rejects.by_reason.get("self_check_failed", 0),
        "self_check_failure_rate": rejects.by_reason.get("self_check_failed", 0)
        / max(1, agg["done"]),
        "num_truncated": agg["truncated"],
        "seq_length": params.seq_length,
        "length_policy": params.length_policy,
        "min_valid_tokens": params.min_valid_tokens,
        "train_on": params.train_on,
        "mask_method": setup.masker.method,
        "generation_header": setup.masker.header,
        "end_tokens": setup.masker.end_tokens,
        "turns_without_end_token": agg["turns_without_end_token"],
        "turns_skipped_empty": agg["turns_skipped_empty"],
        "boundary_splits": agg["boundary_splits"],
        # rows built from the generated token ids vs from the rendered text (tokenrows.py)
        "rows_from_token_ids": agg["rows_from_token_ids"],
        "rows_from_text": agg["rows_from_text"],
        "token_rows_dropped_by_length": agg["token_rows_dropped_by_length"],
        "token_ids": {"used": tokens is not None,
                      "records": len(tokens) if tokens is not None else 0,
                      "turns": tokens.num_turns if tokens is not None else 0},
        "chat_template_sha256": setup.sha,
        "chat_template_kwargs": setup.kwargs,
        "render_time": setup.now.isoformat(),
        "tokenizer_path": setup.tok_path,
        "length_percentiles": length_percentiles(lens),
        "token_freq": "token_freq.pt",
        "draft_vocab": vocab_files or None,
        "dataset_path": inputs.dataset.path,
        "num_workers": workers,
        "timings_s": timings,
    }
