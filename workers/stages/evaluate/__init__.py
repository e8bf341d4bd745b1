"""Stage `evaluate`: measure a drafter's acceptance against its target before anyone serves it.

inputs:
    target            resolved target {"path", "tokenizer_path", "chat_template",
                      "chat_template_kwargs", "config"}
    drafter           {"path": speculators checkpoint dir (or a folder holding one), "meta"}
    data              {"path", "meta", "kind": "tokenized" | "dataset"} held-out rows/prompts
    baseline_drafter  {"path", "meta"} (optional)
params: see `params.EvalParams`.
output: artifact "report" of kind `eval_report` (out_dir/report: report.json, acceptance.png).

Measures: `tau_sim` (teacher-forced, cheap), `specdec` (real greedy speculative decoding with
the transformers backend: ground truth, with a token-for-token check against plain greedy
output), `vllm` (GPU boxes: vLLM's own spec-decode counters). Beside `specdec`, prompt lookup
(vLLM's `ngram`, prompt_lookup.py) is decoded by the same loop as the free baseline. The
verdict is "reject" unless tau clears `min_tau` and beats both the baseline and prompt lookup
by `min_gain` (verdict.py); the job itself still succeeds. `diagnostics` say why: the share
of reference tokens outside the draft vocabulary, acceptance per position.
"""

from __future__ import annotations

import time
from pathlib import Path

from contracts.evaluate import EvalParams
from contracts.resolved import EvaluateResolved, ResolvedArtifact
from workers.stages.common import StageContext, StageError, template_sha256
from workers.stages.evaluate.drafter import check_fit, read_drafter
from workers.stages.evaluate.params import template_mismatch
from workers.stages.evaluate.verdict import verdict
from workers.stages.kernel import input_error, target_config

__all__ = ["run"]


def run(p: EvalParams, inputs: EvaluateResolved, ctx: StageContext) -> dict:
    t_start = time.monotonic()
    target, data = inputs.target, inputs.data
    if data.kind not in ("tokenized", "dataset"):
        raise input_error("inputs.data.kind", f"must be 'tokenized' or 'dataset', "
                          f"got {data.kind!r}")
    config = target_config(target)
    drafter_spec = read_drafter(inputs.drafter.path)
    check_fit(drafter_spec, config)
    base = inputs.baseline_drafter
    base_spec = read_drafter(base.path) if base is not None else None
    if base_spec is not None:
        check_fit(base_spec, config, label="baseline drafter")
    if "vllm" in p.measures:
        from workers.stages.evaluate.vllm_metrics import vllm_available

        why = vllm_available()
        if why:
            raise StageError("vllm_unavailable", f"measure 'vllm' cannot run here: {why}")

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target.tokenizer, local_files_only=True)
    template = p.chat_template or target.chat_template or (
        tok.chat_template if isinstance(tok.chat_template, str) else None)
    kwargs = {**target.chat_template_kwargs, **p.chat_template_kwargs}
    sha = template_sha256(template) if template else None
    why = template_mismatch(data.meta, kwargs, sha)
    if why and not p.allow_template_mismatch:
        raise StageError("template_mismatch", f"held-out data was made with another chat "
                         f"template or thinking mode than this evaluation: {why} (set "
                         f"allow_template_mismatch to measure anyway)")
    if why:
        ctx.warning(f"template mismatch allowed: {why}")

    from workers.stages.evaluate.measure import Evaluation

    ev = Evaluation(p, target, tok, drafter_spec, base_spec, ctx)
    prompts, rows = ev.load_data(data, template, kwargs)
    report = ev.measure(prompts, rows, Path(ctx.work_dir))
    report.update({
        "target": {"path": target.path},
        "data": {"path": data.path, "kind": data.kind, "prompts": len(prompts),
                 "rows": len(rows) if rows is not None else None},
        "params": p.model_dump(),
        "chat_template_sha256": sha,
        "chat_template_kwargs": kwargs,
        "enable_thinking": kwargs.get("enable_thinking"),
        "template_mismatch": why,
    })
    report["evaluated_on"] = evaluated_on(p.evaluated_on, data)
    report["verdict"], report["verdict_reason"] = verdict(report, p)
    report["seconds"] = round(time.monotonic() - t_start, 2)

    from workers.stages.evaluate.report import write_report

    folder = write_report(Path(ctx.out_dir) / "report", report)
    summary = {
        "tau": report.get("tau"), "tau_sim": report.get("tau_sim"),
        "tau_baseline": (report.get("baseline") or {}).get("tau"),
        "tau_sim_baseline": (report.get("baseline") or {}).get("tau_sim"),
        "tau_prompt_lookup": (report.get("prompt_lookup") or {}).get("tau"),
        "verdict": report["verdict"], "verdict_reason": report["verdict_reason"],
        "evaluated_on": report["evaluated_on"],
        "oov_share": report["diagnostics"]["draft_vocab"]["oov_share"],
        "acceptance_rate_per_position": report["diagnostics"]["acceptance_rate_per_position"],
    }
    ctx.artifact("report", "eval_report", folder,
                 {**summary, "drafter": str(drafter_spec.path), "chat_template_kwargs": kwargs,
                  "chat_template_sha256": sha})
    return summary


def evaluated_on(which: str | None, data: ResolvedArtifact) -> str | None:
    """What the measures ran on, in the words the report and the verdict use."""
    meta = data.meta
    if which == "held_out":
        n = (meta.get("split") or {}).get("held_out", meta.get("num_records"))
        return f"held out: {n} records never trained on"
    if which == "in_sample":
        return "in-sample, as requested: on the records it trained on"
    if which == "given":
        n = meta.get("num_records")
        # A dataset given by name or id resolves with its name (app/jobs/inputs.py): people
        # know their data by name, the artifact id only finds it.
        what = (f"{data.name}, {data.dataset_id}" if data.name else data.id or data.path)
        return f"on the evaluation data given ({what}" + (
            f", {n} records)" if n is not None else ")")
    return None

