"""`plan`: dry-run a whole run on a sample of its dataset, without GPUs, in seconds.

Catches what today costs hours: a template that raises on some record shapes, empty masks,
sequences longer than `seq_length`, hidden states that will not fit on disk, layer ids the
target does not have, a thinking mode that differs between generate, prepare and evaluate,
and drafter params that do not fit the target.

Spec: inputs and params as contracts/resolved.py `PlanInputs` and `PlanParams` (the run's
body, the records to sample, where hidden states would go). Returns {"ok", "checks", "estimates", "warnings",
"failures"}; the API answers it as the plan.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter
from typing import Any

import numpy as np
from pydantic import ValidationError

from contracts.drafters import DEFAULT_DRAFTER, target_problem
from contracts.jobtypes import JOB_TYPES
from contracts.resolved import PlanInputs, PlanParams, ResolvedArtifact, ResolvedTarget
from contracts.run import RunSpec, RunSpecError
from contracts.target import text_value
from workers.stages.common import StageContext, StageError
from workers.stages.extract.layers import hidden_size, num_hidden_layers, resolve_layers
from workers.stages.extract.planner import disk_check, estimate_hidden_state_bytes, human_bytes
from workers.stages.failures import source_line
from workers.stages.kernel import parse_params
from workers.stages.plan_time import estimate, merge_rates, weights_check
from workers.stages.plan_training import estimate_training, vocab_coverage
from workers.stages.prepare import resolve_setup
from workers.stages.prepare.masks import RecordRejected, build_masker
from workers.stages.records import count_records, iter_records

# Stands in for the target's answer when the run regenerates answers: the dry run checks that
# each record *shape* renders and masks, never stores this text.
PLACEHOLDER_ANSWER = "def answer():\n    return 42"


class Plan:
    def __init__(self) -> None:
        self.checks: list[dict] = []
        self.warnings: list[str] = []
        self.failures: list[dict] = []
        self.estimates: dict[str, Any] = {}
        self.gpus: dict[str, int] = {}  # the GPUs each stage's job asks for

    def check(self, name: str, ok: bool, message: str, **details: Any) -> bool:
        self.checks.append({"name": name, "ok": bool(ok), "message": message,
                            **({"details": details} if details else {})})
        return ok

    @property
    def ok(self) -> bool:
        return all(c["ok"] for c in self.checks)


def _expand(plan: Plan, run: dict) -> dict[str, dict]:
    """The run's jobs by stage, as POST /v1/runs will submit them (contracts/run.py: one
    expansion for both), so the plan checks exactly those params."""
    try:
        jobs = RunSpec.model_validate(run).expand()
    except ValidationError as e:
        err = e.errors()[0]
        plan.check("run", False, f"{'.'.join(map(str, err['loc']))}: {err['msg']}")
        return {}
    except RunSpecError as e:
        plan.check("run", False, f"{e.param}: {e.message}")
        return {}
    plan.gpus = {j.key: j.gpus for j in jobs}
    return {j.key: j.params for j in jobs}


def stage(key: str) -> str:
    """A job's stage from its key in the run (`train`, `train:<drafter>`: contracts/run.py)."""
    return key.partition(":")[0]


def _params(plan: Plan, chain: dict[str, dict]) -> dict:
    """Validate every job's params as the stage will (the one parser, the stage's model)."""
    parsed: dict[str, Any] = {}
    for key, raw in chain.items():
        name = f"{stage(key)}_params" + key.removeprefix(stage(key))  # train_params:<drafter>
        try:
            parsed[key] = parse_params(JOB_TYPES[stage(key)].params, raw)
            plan.check(name, True, f"{key} params are valid")
        except StageError as e:
            plan.check(name, False, f"{key}: {e.message}")
    return parsed


def _thinking(plan: Plan, chain: dict[str, dict]) -> None:
    seen = {key: (chain[key].get("chat_template_kwargs") or {}).get("enable_thinking")
            for key in chain if stage(key) in ("generate", "prepare", "evaluate")}
    values = set(map(str, seen.values()))
    plan.check("thinking_mode", len(values) <= 1,
               "thinking mode is the same in " + ", ".join(seen) if len(values) <= 1 else
               "thinking mode differs between stages: " +
               ", ".join(f"{k}: enable_thinking={v}" for k, v in seen.items()) +
               " (a mismatch is the best-known cause of collapsed acceptance)")


def _layers_and_drafter(plan: Plan, chain: dict[str, dict], target: ResolvedTarget,
                        parsed: dict) -> dict[str, Any]:
    """Each drafter's layers and fit to the target (one check each; `<name>` after the check's
    name for one of several drafters); answers the layers each extract stores, by key."""
    cfg = target.config
    vocab = text_value(cfg, "vocab_size")
    for key in (k for k in chain if stage(k) == "train"):
        drafter = chain[key].get("drafter") or {}
        suffix = key.removeprefix("train")  # "" or ":<drafter>"
        try:
            lp = resolve_layers(cfg, drafter.get("type", DEFAULT_DRAFTER),
                                drafter.get("target_layer_ids"))
            plan.check("layer_ids" + suffix, True, f"layers {list(lp.aux)} + last "
                       f"({lp.num_target_layers}) exist in the target "
                       f"({num_hidden_layers(cfg)} layers)" + (f" ({key})" if suffix else ""))
        except StageError as e:
            plan.check("layer_ids" + suffix, False, e.message + (f" ({key})" if suffix else ""))
        dv = drafter.get("draft_vocab_size")
        unfit = target_problem(drafter.get("type", DEFAULT_DRAFTER), cfg)
        if unfit:
            plan.check("drafter_params" + suffix, False, unfit + (f" ({key})" if suffix else ""))
        elif dv and vocab and dv > vocab:
            plan.check("drafter_params" + suffix, False, f"draft_vocab_size {dv} exceeds the "
                       f"target's vocabulary ({vocab})" + (f" ({key})" if suffix else ""))
        elif key in parsed:
            plan.check("drafter_params" + suffix, True, f"{drafter.get('type')} drafter fits "
                       f"the target (hidden {hidden_size(cfg)}, vocab {vocab})")
    stored: dict[str, Any] = {}
    for key in (k for k in chain if stage(k) == "extract"):
        with contextlib.suppress(StageError):  # a bad layer id fails its drafter's check
            stored[key] = resolve_layers(cfg, chain[key].get("drafter_type", DEFAULT_DRAFTER),
                                         chain[key].get("layer_ids"))
    return stored


def _records(plan: Plan, dataset: ResolvedArtifact | None, target: ResolvedTarget, chain: dict[str, dict],
             parsed: dict, sample: int, ctx: StageContext) -> list[int]:
    if dataset is None:
        plan.warnings.append("the dataset is still being ingested: record checks skipped")
        return []
    prep = parsed.get("prepare")
    if prep is None:
        return []
    try:
        tok, _, text, kwargs = resolve_setup(target, prep)
    except StageError as e:
        plan.check("chat_template", False, e.message)
        return []
    plan.check("chat_template", True, "the chat template compiles")
    masker = build_masker(tok, text, kwargs, prep.train_on)
    regen = "generate" in chain
    gen_tokens = (parsed["generate"].max_tokens if regen and "generate" in parsed else 0)
    lengths: list[int] = []
    trained: list[list[int]] = []  # loss-masked token ids of records with their own answers
    reasons: Counter[str] = Counter()
    n = 0
    for rec in itertools.islice(iter_records(dataset.path), sample):
        n += 1
        if regen:
            msgs = list(rec["messages"])
            if not msgs or msgs[-1]["role"] != "assistant":
                msgs.append({"role": "assistant", "content": PLACEHOLDER_ANSWER})
            msgs = [({**m, "content": PLACEHOLDER_ANSWER} if m["role"] == "assistant" else m)
                    for m in msgs]
            rec = {**rec, "messages": msgs}
        try:
            out = masker.encode([masker.locate(rec)])[0]
            if isinstance(out, RecordRejected):
                raise out
            if int(np.asarray(out.loss_mask).sum()) == 0:
                raise RecordRejected("empty_mask", "no token is trained")
            extra = (gen_tokens - len(masker.tokenizer(PLACEHOLDER_ANSWER)["input_ids"])
                     if regen else 0)
            lengths.append(len(out.input_ids) + max(0, extra))
            if not regen:
                trained.append([int(t) for t, m in zip(out.input_ids, out.loss_mask) if m])
        except RecordRejected as e:
            reason = f"{e.code}: {e.detail}" if e.detail else e.code
            reasons[e.code] += 1
            if len(plan.failures) < 50:
                plan.failures.append({"id": rec["id"], "source": rec.get("source"),
                                      "line": source_line(rec.get("source")),
                                      "reason": reason})
        ctx.progress(n, sample, "records", stage="plan")
    bad = len(plan.failures) and sum(reasons.values())
    fix = _fix(reasons, regen)
    plan.check("records_render", bad == 0,
               f"all {n} sampled records render and mask" if not bad else
               f"{bad} of {n} sampled records fail: " +
               "; ".join(f"{k} x{v}" for k, v in reasons.most_common(5)) +
               (f" ({fix})" if fix else ""),
               failed=int(bad), sampled=n)
    if bad:
        _budget_warning(plan, parsed, int(bad), n, fix)
    _coverage(plan, parsed, trained, regen)
    if lengths:
        arr = np.asarray(lengths)
        pct = {f"p{q}": int(np.percentile(arr, q)) for q in (50, 90, 99)} | {"max": int(arr.max())}
        over = int((arr > prep.seq_length).sum())
        plan.estimates["token_length_percentiles"] = pct
        plan.check("lengths", over == 0 or prep.length_policy == "truncate",
                   f"{over} of {len(arr)} sampled records exceed seq_length {prep.seq_length} "
                   f"(policy {prep.length_policy}); p99 {pct['p99']} tokens")
        if over and prep.length_policy == "truncate":
            plan.warnings.append(f"{over} sampled records will be truncated to "
                                 f"{prep.seq_length} tokens")
    return lengths


def _coverage(plan: Plan, parsed: dict, trained: list[list[int]], regen: bool) -> None:
    train = parsed.get("train")
    if train is None:
        return
    if regen:  # the target writes the answers: their tokens are unknown until generate ran
        plan.estimates["draft_vocab_coverage"] = {"skipped": "answers are regenerated"}
        return
    cov = vocab_coverage(trained, train.drafter.draft_vocab_size, plan.warnings)
    if cov is not None:
        plan.estimates["draft_vocab_coverage"] = cov


def _fix(reasons: Counter[str], regen: bool) -> str | None:
    """The field to add when records fail for want of an answer: a prompt-only record
    (needs_generate) is answered by the generate stage, and no budget makes it trainable."""
    if reasons.get("needs_generate") and not regen:
        return ("needs_generate: these records have no assistant answer; add stages.generate, "
                "e.g. {\"backend\": \"auto\"}, and the target writes them")
    return None


def _budget_warning(plan: Plan, parsed: dict, bad: int, n: int, fix: str | None) -> None:
    """Warn when the share of sampled records that fail would exceed the failure budget of
    the first stage that meets them: `force_plan` would otherwise start a run that stops
    there. The advice is `fix` where there is one (a missing stage), else the
    budget."""
    for stage, field in (("generate", "max_failure_share"), ("prepare", "max_reject_share")):
        if stage not in parsed:
            continue
        budget = getattr(parsed[stage], field)
        if bad / n > budget:
            plan.warnings.append(
                f"{bad} of {n} sampled records ({bad / n:.0%}) cannot be rendered, more than "
                f"{stage}'s {field}={budget}: the run would stop in {stage} (" +
                (fix or f"fix or drop these records, or raise stages.{stage}.{field}") + ")")
        return  # later stages never see the records the first one dropped


def _disk(plan: Plan, lengths: list[int], dataset: ResolvedArtifact | None, stored: dict[str, Any],
          parsed: dict, disk_path: str, free_override: int | None) -> dict[str, int]:
    """Records, tokens and the disk every extract's hidden states need together; answers
    each extract's bytes by key."""
    total = count_records(dataset.path) if dataset else 0
    tokens = int(np.mean(lengths) * total) if lengths else 0
    plan.estimates["records"] = total
    plan.estimates["tokens"] = tokens
    each = {key: estimate_hidden_state_bytes(tokens, lp.num_stored, lp.hidden_size,
                                             parsed[key].dtype, total)
            for key, lp in stored.items() if key in parsed}
    plan.estimates["hidden_state_bytes"] = need = sum(each.values())
    if not each:  # online: no hidden states stored
        return each
    ex = parsed[next(iter(each))]  # the extracts of a run share stages.extract
    dc = disk_check(need, disk_path, ex.disk_margin_bytes, free_override)
    plan.estimates["disk_free_bytes"] = dc.free_bytes
    from workers.stages.cpu import float32_note

    note = float32_note(ex.dtype)
    if note:  # the planning machine's CPU: said for a run whose extract runs on CPUs like it
        plan.warnings.append(f"extract: {note}")
    plan.check("disk", dc.ok, f"hidden states need {human_bytes(need)}; "
               f"{human_bytes(dc.free_bytes)} free at {dc.path}" +
               ("" if dc.ok else " — options: fewer samples, online mode, another volume "
                                 "(DRAFTYARD_HOME)"))
    return each


def run(p: PlanParams, inputs: PlanInputs, ctx: StageContext) -> dict:
    target, dataset = inputs.target, inputs.dataset
    plan = Plan()
    chain = _expand(plan, p.run)
    parsed = _params(plan, chain)
    _thinking(plan, chain)
    stored = _layers_and_drafter(plan, chain, target, parsed)
    lengths = _records(plan, dataset, target, chain, parsed, p.sample, ctx)
    hidden = _disk(plan, lengths, dataset, stored, parsed, p.disk_path or str(ctx.out_dir),
                   p.free_bytes_override)
    for key in (k for k in parsed if stage(k) == "train"):  # one per drafter
        training = estimate_training({**parsed, "train": parsed[key]}, lengths,
                                     plan.estimates.get("records", 0), plan.warnings)
        if training is not None:
            plan.estimates["training" + key.removeprefix("train")] = training
    ok, message = weights_check(chain, target)
    plan.check("target_weights", ok, message)
    return {"ok": plan.ok, "checks": plan.checks, "estimates": plan.estimates,
            "time_estimates": _time(plan, chain, parsed, target, lengths, p.rates, hidden),
            "warnings": plan.warnings, "failures": plan.failures}


def _time(plan: Plan, chain: dict[str, dict], parsed: dict, target: ResolvedTarget, lengths: list[int],
          override: dict | None, hidden: dict[str, int]) -> dict:
    """Per stage GPU-hours, wall and disk (workers/stages/plan_time.py), with the rates used."""
    rates, from_deployment, warnings = merge_rates(override)
    plan.warnings.extend(warnings)
    records = int(plan.estimates.get("records") or 0)
    mean = float(np.mean(lengths)) if lengths else 0.0
    total = float(plan.estimates.get("tokens") or 0)
    if "generate" in parsed:  # the sampled lengths count max_tokens answer tokens
        max_tokens = parsed["generate"].max_tokens
        ans = rates["answer_tokens"] or max_tokens
        mean = max(0.0, mean - max_tokens)
        total = records * (mean + ans)
    stages = estimate(chain, plan.gpus, target, records, mean, total, hidden, rates)
    return {"stages": stages,
            "total_gpu_hours": round(sum(s["gpu_hours"] for s in stages), 3),
            "total_wall_hours": round(sum(s["wall_hours"] for s in stages), 3),
            "total_disk_bytes": sum(s["disk_bytes"] for s in stages),
            "rates": rates, "rates_from_deployment": from_deployment}
