"""The measuring part of `evaluate`: load models, run each measure, assemble the numbers."""

from __future__ import annotations

import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from contracts.evaluate import EvalParams
from contracts.resolved import ResolvedArtifact, ResolvedTarget
from workers.stages.common import StageContext, StageError
from workers.stages.evaluate.data import (
    Row,
    load_tokenized_rows,
    prompts_from_dataset,
    prompts_from_rows,
)
from workers.stages.evaluate.drafter import DrafterSpec, load_drafter, untrained_like
from workers.stages.evaluate.prompt_lookup import PromptLookupProposer
from workers.stages.evaluate.proposers import make_proposer
from workers.stages.evaluate.specdec import (
    acceptance_stats,
    hf_greedy,
    plain_greedy,
    speculative_greedy,
    tau_by_source,
)
from workers.stages.evaluate.target import (
    TargetRunner,
    device_and_dtype,
    eos_ids,
    load_target,
)
from workers.stages.evaluate.tau_sim import teacher_forced_acceptance
from workers.stages.evaluate.verdict import diagnostics, draft_vocab_coverage


class Evaluation:
    def __init__(self, p: EvalParams, target: ResolvedTarget, tokenizer: Any, drafter: DrafterSpec,
                 baseline: DrafterSpec | None, ctx: StageContext):
        self.p = p
        self.target = target
        self.tok = tokenizer
        self.drafter = drafter
        self.baseline_spec = baseline
        self.ctx = ctx
        self.num_spec = p.block_size - 1 if p.block_size else None
        self.phases: list[str] = []
        # Each prompt's source dataset (dataset data only): a mixed set reports tau by source.
        self.sources: list[str] = []

    # -- data ---------------------------------------------------------------------------
    def load_data(self, data: ResolvedArtifact, template: str | None,
                  kwargs: dict) -> tuple[list[list[int]], list[Row] | None]:
        p = self.p
        if data.kind == "tokenized":
            rows = load_tokenized_rows(data.path, limit=max(p.tau_sim_rows, p.num_prompts),
                                       seed=p.seed)
            prompts = prompts_from_rows(rows)[:p.num_prompts]
            rows = rows[:p.tau_sim_rows]
        else:
            prompts, failed = prompts_from_dataset(data.path, self.tok, template, kwargs,
                                                   p.num_prompts, p.seed, self.sources)
            if failed:
                self.ctx.warning(f"{failed} held-out records could not be rendered as prompts "
                                 f"and were skipped", count=failed)
            rows = None  # tau_sim then runs on the target's greedy answers to these prompts
        if not prompts and ({"specdec", "vllm"} & set(p.measures) or rows is None):
            raise StageError("invalid_input", f"no usable prompts in {data.path}")
        if rows is not None and not rows and "tau_sim" in p.measures:
            raise StageError("invalid_input", f"no tokenized rows in {data.path}")
        return prompts, rows

    # -- models -------------------------------------------------------------------------
    def _load(self) -> None:
        path = self.target.path
        device, dtype = device_and_dtype()
        self.device = device
        self.model = load_target(path, device, dtype)
        self.eos = eos_ids(self.model, self.tok)
        self.draft_model = load_drafter(self.drafter, path, device, dtype)
        self.proposer = make_proposer(self.draft_model, self.num_spec)
        self.runner = TargetRunner(self.model, self.drafter.aux_layer_ids)
        self.base_proposer = None
        self.base_runner = self.runner
        self.base_kind = None
        if self.baseline_spec is not None:
            self.base_proposer = make_proposer(
                load_drafter(self.baseline_spec, path, device, dtype), self.num_spec)
            self.base_kind = "drafter"
            if self.baseline_spec.aux_layer_ids != self.drafter.aux_layer_ids:
                self.base_runner = TargetRunner(self.model, self.baseline_spec.aux_layer_ids)
        elif self.p.baseline == "untrained":
            self.base_proposer = make_proposer(
                untrained_like(self.draft_model, path, self.p.seed), self.num_spec)
            self.base_kind = "untrained"

    # -- measures -----------------------------------------------------------------------
    def measure(self, prompts: list[list[int]], rows: list[Row] | None, work_dir: Path) -> dict:
        import torch

        torch.manual_seed(self.p.seed)
        t0 = time.monotonic()
        self._load()
        measures = set(self.p.measures)
        max_pos = getattr(self.model.config.get_text_config(), "max_position_embeddings", None)
        if max_pos:
            keep = [i for i, q in enumerate(prompts)
                    if len(q) + self.p.max_new_tokens + 64 <= max_pos]
            if len(keep) < len(prompts):
                self.ctx.warning(f"{len(prompts) - len(keep)} prompts too long for the "
                                 f"target's {max_pos} positions were skipped")
            prompts = [prompts[i] for i in keep]
            self.sources = [self.sources[i] for i in keep] if self.sources else []
            if rows is not None:
                rows = [r for r in rows if len(r[0]) <= max_pos]
        report: dict = {
            "drafter": {"path": str(self.drafter.path), "kind": self.drafter.kind,
                        "num_speculative_tokens": self.proposer.num_spec,
                        "aux_layer_ids": self.drafter.aux_layer_ids},
            "tau": None, "tau_sim": None, "acceptance_rate_per_position": [],
            "histogram": {}, "tokens_per_s": None, "lossless": None, "baseline": None,
            "vllm": None, "device": self.device, "prompt_lookup": None,
        }
        base: dict | None = None
        if self.base_proposer is not None:
            base = {"kind": self.base_kind,
                    "path": str(self.baseline_spec.path) if self.baseline_spec else None,
                    "tau": None, "tau_sim": None}

        self._plan_phases(measures, rows, base is not None)
        refs: list[list[int]] = []
        if "specdec" in measures or rows is None:
            refs = self._references(prompts)
        steps: list | None = None  # per prompt: (anchors, accepted) of real decoding, when lossless
        if "specdec" in measures:
            plain = self._plain(prompts)
            report.update(self._specdec(prompts, refs, plain, self.runner, self.proposer,
                                        "drafter"))
            steps = report.pop("_steps")
            accepted = {"tau": report.pop("_accepted")}
            if base is not None:
                base.update(self._specdec(prompts, refs, plain, self.base_runner,
                                          self.base_proposer, "baseline"))
                base.pop("_steps")
                accepted["tau_baseline"] = base.pop("_accepted")
            report["prompt_lookup"] = self._prompt_lookup(prompts, refs, plain)
            accepted["tau_prompt_lookup"] = report["prompt_lookup"].pop("_accepted")
            if len(set(self.sources)) > 1:
                report["by_source"] = tau_by_source(self.sources, accepted)
        if "tau_sim" in measures:
            sim_rows = rows if rows is not None else [
                (q + r, [0] * len(q) + [1] * len(r)) for q, r in zip(prompts, refs, strict=True)]
            # On the target's own greedy answers, the contexts of real decoding are exactly
            # these rows: compare step by step at the anchors decoding visited.
            runs_at = [s[0] if s else [] for s in steps] if rows is None and steps else None
            res = self._tau_sim(sim_rows, self.runner, self.proposer, "tau_sim", runs_at)
            runs = res.pop("runs")
            report.update(res)
            report["tau_sim_source"] = "tokenized rows" if rows is not None else \
                "prompts + the target's greedy answers"
            if runs_at is not None and steps:  # runs_at is set only with steps
                report["tau_sim_on_decode_anchors"] = _same_anchor_agreement(steps, runs)
            if base is not None:
                res = self._tau_sim(sim_rows, self.base_runner, self.base_proposer,
                                    "tau_sim baseline")
                res.pop("runs")
                base.update(res)
        if "vllm" in measures:
            from workers.stages.evaluate.vllm_metrics import measure_with_vllm

            self._progress(0, len(prompts), "prompts", "vLLM")
            report["vllm"] = measure_with_vllm(
                self.target.path, str(self.drafter.path), self.drafter.kind,
                self.proposer.num_spec, prompts, self.p.max_new_tokens, work_dir,
                port=self.p.vllm_port, options=self.p.vllm)
            self._progress(len(prompts), len(prompts), "prompts", "vLLM")
        report["baseline"] = base
        # The tokens the drafter should have proposed: the target's greedy answers, or the
        # trained (masked) tokens of the held-out rows.
        references = refs or [[t for t, m in zip(ids, mask, strict=True) if m]
                              for ids, mask in rows or []]
        report["diagnostics"] = diagnostics(
            report, draft_vocab_coverage(self.draft_model, references, self.tok))
        report["measure_seconds"] = round(time.monotonic() - t0, 2)
        return report

    # -- progress -----------------------------------------------------------------------
    def _plan_phases(self, measures: Collection[str], rows: list[Row] | None, baseline: bool) -> None:
        """The phases `measure` goes through, in order. Each restarts the progress bar, so
        each report names its phase and its place ("evaluate: with the drafter (3/5)")."""
        plan = [("reference answers", "specdec" in measures or rows is None),
                ("target alone", "specdec" in measures),
                ("with the drafter", "specdec" in measures),
                ("with the baseline", "specdec" in measures and baseline),
                ("with the prompt lookup", "specdec" in measures),
                ("tau_sim", "tau_sim" in measures),
                ("tau_sim baseline", "tau_sim" in measures and baseline),
                ("vLLM", "vllm" in measures)]
        self.phases = [name for name, runs in plan if runs]

    def _progress(self, done: int, total: int, unit: str, phase: str) -> None:
        """A phase reports 0 when it starts (forced: the bar and the rate's clock restart
        there), then as it goes."""
        if phase not in self.phases:  # a phase the plan above does not know yet goes last
            self.phases.append(phase)
        k, n = self.phases.index(phase) + 1, len(self.phases)
        self.ctx.progress(done, total, unit, stage=f"evaluate: {phase} ({k}/{n})",
                          force=done == 0, phase=phase, phase_index=k, phases=n)

    def _references(self, prompts: list[list[int]]) -> list[list[int]]:
        refs = []
        self._progress(0, len(prompts), "prompts", "reference answers")
        for i, q in enumerate(prompts):
            refs.append(hf_greedy(self.model, q, self.p.max_new_tokens, self.eos))
            self._progress(i + 1, len(prompts), "prompts", "reference answers")
        return refs

    def _plain(self, prompts: list[list[int]]) -> tuple[int, float]:
        """(tokens, seconds) of the target alone over all prompts: the speed baseline."""
        tokens, seconds = 0, 0.0
        self._progress(0, len(prompts), "prompts", "target alone")
        for i, q in enumerate(prompts):
            out = plain_greedy(self.runner, q, self.p.max_new_tokens, self.eos)
            tokens += len(out.tokens)
            seconds += out.seconds
            self._progress(i + 1, len(prompts), "prompts", "target alone")
        return tokens, seconds

    def _specdec(self, prompts: list[list[int]], refs: list[list[int]],
                 plain: tuple[int, float], runner: TargetRunner, proposer: Any,
                 who: str) -> dict:
        accepted: list[int] = []
        per_prompt: list[tuple[list[int], list[int]] | None] = []
        accepted_per_prompt: list[list[int]] = []
        spec_s = 0.0
        spec_tokens = 0
        plain_tokens, plain_s = plain
        equal = 0
        mismatch = None
        self._progress(0, len(prompts), "prompts", f"with the {who}")
        for i, (q, ref) in enumerate(zip(prompts, refs, strict=True)):
            spec = speculative_greedy(runner, proposer, q, self.p.max_new_tokens, self.eos)
            spec_s += spec.seconds
            spec_tokens += len(spec.tokens)
            accepted.extend(spec.accepted)
            accepted_per_prompt.append(spec.accepted)
            per_prompt.append((spec.anchors, spec.accepted) if spec.tokens == ref else None)
            if spec.tokens == ref:
                equal += 1
            elif mismatch is None:
                pairs = enumerate(zip(spec.tokens, ref, strict=False))
                at = next((j for j, (a, b) in pairs if a != b), min(len(spec.tokens), len(ref)))
                mismatch = {"prompt": i, "position": at, "specdec": spec.tokens[at:at + 4],
                            "greedy": ref[at:at + 4]}
            self._progress(i + 1, len(prompts), "prompts", f"with the {who}")
        stats = acceptance_stats(accepted, proposer.num_spec)
        if equal != len(prompts):
            self.ctx.warning(f"{who}: {len(prompts) - equal} of {len(prompts)} speculative "
                             f"outputs differ from plain greedy output", first=mismatch)
        tps_spec = spec_tokens / spec_s if spec_s > 0 else None
        tps_plain = plain_tokens / plain_s if plain_s > 0 else None
        stats.update({
            "tokens_per_s": {"specdec": tps_spec, "target_alone": tps_plain,
                             "speedup": (tps_spec / tps_plain) if tps_spec and tps_plain else None},
            "lossless": {"checked": len(prompts), "equal": equal, "first_mismatch": mismatch},
            "generated_tokens": spec_tokens,
            "_steps": per_prompt,
            "_accepted": accepted_per_prompt,
        })
        return stats

    def _prompt_lookup(self, prompts: list[list[int]], refs: list[list[int]],
                       plain: tuple[int, float]) -> dict:
        """The free baseline, decoded by the same loop with the drafter's K (verdict.py)."""
        p = self.p
        proposer = PromptLookupProposer(self.proposer.num_spec, p.prompt_lookup_min,
                                        p.prompt_lookup_max)
        # No aux layers: prompt lookup reads tokens only, so the target skips hidden states.
        res = self._specdec(prompts, refs, plain, TargetRunner(self.model), proposer,
                            "prompt lookup")
        res.pop("_steps")
        return {"prompt_lookup_min": p.prompt_lookup_min,
                "prompt_lookup_max": p.prompt_lookup_max,
                "num_speculative_tokens": proposer.num_spec, **res}

    def _tau_sim(self, rows: list[Row], runner: TargetRunner, proposer: Any, label: str,
                 runs_at: list[list[int]] | None = None) -> dict:
        self._progress(0, len(rows), "rows", label)
        res = teacher_forced_acceptance(
            runner, proposer, rows,
            on_row=lambda n: self._progress(n, len(rows), "rows", label),
            runs_at=runs_at)
        res["tau_sim_rows"] = len(rows)
        return res


def _same_anchor_agreement(steps: list, runs: list[dict[int, int]]) -> dict:
    """Teacher-forced vs real accepted drafts at the anchors real decoding visited.

    Same contexts, same drafter, same target: they must agree (up to float ties between a
    batched and an incremental forward). The gap between tau_sim over all anchors and real
    tau is then the anchor-selection bias: decoding restarts right after a miss, where
    the next drafts are harder than average.
    """
    real, sim = [], []
    for s, r in zip(steps, runs, strict=True):
        if not s:
            continue
        for anchor, acc in zip(*s, strict=True):
            if anchor in r:
                real.append(acc)
                sim.append(r[anchor])
    n = len(real)
    return {
        "steps": n,
        "equal_steps": sum(1 for a, b in zip(real, sim, strict=True) if a == b),
        "tau": (1 + sum(real) / n) if n else None,
        "tau_sim": (1 + sum(sim) / n) if n else None,
    }
