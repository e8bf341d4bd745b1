"""The generation loop: records in windows, each window's turns in rounds, one shard per
window.

A window of records is answered turn by turn: round k asks the backend for every record's
k-th answer at once (the backend sorts them by length and batches them), so the target's
answer to turn k is in the history of turn k+1. When every record of the window is answered
or failed, the window becomes one shard: a kill loses at most the window in flight.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from contracts.generate import GenerateParams
from workers.stages.common import StageContext, StageError
from workers.stages.failures import FailureLog
from workers.stages.generate.backends.base import GenerateBackend, GenRequest, GenResult
from workers.stages.generate.plan import RecordJob, turn_seed
from workers.stages.generate.render import PromptRenderer, RenderError, opens_think, split_reasoning
from workers.stages.generate.shards import ShardStore, shard_row

TEMPLATE_ERROR = "template_error"
PROMPT_TOO_LONG = "prompt_too_long"
EMPTY_ANSWER = "empty_answer"
NOTHING_TO_GENERATE = "nothing_to_generate"


@dataclass
class RunState:
    total: int
    done: int  # records finished, this attempt and earlier ones
    failed: int
    tokens: int = 0  # generated in this attempt
    gen_seconds: float = 0.0
    started: float = field(default_factory=time.monotonic)


class Runner:
    def __init__(self, backend: GenerateBackend, renderer: PromptRenderer,
                 params: GenerateParams, store: ShardStore, ctx: StageContext, state: RunState,
                 context_len: int | None, failures: FailureLog):
        self.backend = backend
        self.renderer = renderer
        self.p = params
        self.store = store
        self.ctx = ctx
        self.state = state
        self.context_len = context_len
        self.failures = failures
        limits = [x for x in (params.max_prompt_tokens,
                              context_len - 1 if context_len else None) if x is not None]
        self.prompt_limit = min(limits) if limits else None

    def run(self, records: Iterable[tuple[int, dict]], window: int) -> None:
        buf: list[RecordJob] = []
        for index, rec in records:
            buf.append(RecordJob.create(index, rec, self.p.turns))
            if len(buf) >= window:
                self._window(buf)
                buf = []
        if buf:
            self._window(buf)

    def _window(self, jobs: list[RecordJob]) -> None:
        for j in jobs:
            if not j.positions:
                j.fail(NOTHING_TO_GENERATE, "no assistant turn to answer (no user turn, or "
                       "the final turn is a tool call)")
                self._record_done(j)
        while True:
            pending = [j for j in jobs if not j.done]
            if not pending:
                break
            self._round(pending)
        self.store.write([
            shard_row(j.index, j.record, j.failure, j.failure_detail) if j.failure
            else shard_row(j.index, j.output(), turns=j.turns)
            for j in sorted(jobs, key=lambda j: j.index)])
        self._metric()

    def _round(self, pending: list[RecordJob]) -> None:
        reqs: list[GenRequest] = []
        by_key: dict[str, tuple[RecordJob, bool]] = {}
        for j in pending:
            try:
                text = self.renderer.render(j.history(), tools=j.record.get("tools"))
            except RenderError as e:
                j.fail(TEMPLATE_ERROR, str(e)[:1000])
                self._record_done(j)
                continue
            ids = self.renderer.encode(text)
            if self.prompt_limit is not None and len(ids) > self.prompt_limit:
                j.fail(PROMPT_TOO_LONG, f"{len(ids)} prompt tokens > limit {self.prompt_limit}")
                self._record_done(j)
                continue
            budget = self.p.max_tokens
            if self.context_len:
                budget = min(budget, self.context_len - len(ids))
            reqs.append(GenRequest(key=j.key, prompt_ids=ids, max_tokens=budget,
                                   seed=turn_seed(self.p.seed, j.id, j.position)))
            by_key[j.key] = (j, opens_think(text))
        if not reqs:
            return
        t0 = time.monotonic()
        self.backend.generate(reqs, self._on_result(by_key))
        self.state.gen_seconds += time.monotonic() - t0
        for key in by_key:  # a backend that skipped a request must not loop the window forever
            raise StageError("internal_error", f"the {self.backend.name} backend returned no "
                             f"result for {key}")

    def _on_result(self, by_key: dict) -> Callable[[GenResult], None]:
        def handle(res: GenResult) -> None:
            job, prompt_open = by_key.pop(res.key)
            self.state.tokens += len(res.completion_ids)
            if not res.ok:
                job.fail(res.error or "server_error", res.error_detail)
            else:
                # The text is the decoded ids for every backend (a server's own
                # detokenization may differ), so content/reasoning match the stored ids.
                text = self.renderer.decode(res.completion_ids)
                if not text.strip():
                    job.fail(EMPTY_ANSWER, f"{len(res.completion_ids)} tokens, "
                             f"finish_reason={res.finish_reason}")
                else:
                    reasoning, content = split_reasoning(text, prompt_open)
                    job.answer(reasoning, content, res.prompt_ids, res.completion_ids,
                               res.finish_reason or "stop")
            if job.done:
                self._record_done(job)
        return handle

    def _record_done(self, job: RecordJob) -> None:
        s = self.state
        s.done += 1
        if job.failure is not None:
            s.failed += 1
            self.failures.add(job.id, job.failure, job.failure_detail, job.record.get("source"))
        self.ctx.progress(s.done, s.total, "records", stage="generate")
        # Stop spending GPU hours once the job cannot meet its failure budget any more.
        check_failure_budget(self.failures, s.failed, s.total, self.p.max_failure_share)

    def _metric(self) -> None:
        s = self.state
        rate = s.tokens / s.gen_seconds if s.gen_seconds > 0 else 0.0
        self.ctx.metric(s.done, tokens_generated=s.tokens, tokens_per_s=rate)


def check_failure_budget(failures: FailureLog, failed: int, total: int, share: float) -> None:
    """Raise `too_many_failures` naming the failed records (ids, reasons, messages)."""
    if total and failed / total > share:
        top = "; ".join(f"{k} x{v}" for k, v in failures.by_reason.most_common(5))
        raise StageError("too_many_failures",
                         f"{failed} of {total} records failed, more than "
                         f"max_failure_share={share} ({top}); first: " +
                         ", ".join(f"{f['id']} ({f['reason']})" for f in failures.sample[:5]),
                         failures.summary(failed=failed, total=total))
