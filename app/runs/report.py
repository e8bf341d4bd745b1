"""The run report people read (`GET /v1/runs/{id}/report`): one object that the dashboard's
run page and `draftyard runs show` both render, so the two cannot tell different stories.

Verdict first, then trained vs untrained vs prompt-lookup tau, per-position acceptance, the training curves,
the evaluate plot, the serve command, and the lineage of every artifact (which dataset, which
chat-template hash, which target), with owners by name. The evaluate stage's report.json
grows new keys over time (verdict reasons, OOV shares): read them defensively and pass on
what is there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.jobs import service as jobs
from app.models import Artifact, Dataset, Job, Run, Target, User
from app.runs.compare import compare, drafter_jobs, stored_parameters
from app.runs.service import run_jobs

# Keys of the evaluate stage's report.json shown as they are (when present).
EVAL_KEYS = ("verdict", "verdict_reason", "evaluated_on", "tau", "tau_sim", "tau_baseline",
             "tau_sim_baseline", "tau_prompt_lookup",
             "oov_share", "oov_reference_share", "num_prompts", "exact_match", "template_mismatch",
             "enable_thinking", "chat_template_sha256", "seconds")
# Training series worth a chart: the loss, and acceptance-like ones (DFlash acc_k, EAGLE-3's).
CURVE_PREFIXES = ("loss", "val_loss", "acc_", "val_acc_", "full_acc", "eal")
PLOT_FILES = ("acceptance.png",)


def _names(session: Session, model, ids: set) -> dict:
    ids = {i for i in ids if i}
    if not ids:
        return {}
    return dict(session.execute(select(model.id, model.name).where(model.id.in_(ids))).all())


def _eval_report(art: Artifact | None) -> dict:
    """report.json of an eval_report artifact; {} when it cannot be read (the summary in the
    job's metrics still gives tau and the verdict)."""
    if art is None:
        return {}
    try:
        return json.loads((Path(art.uri) / "report.json").read_text())
    except (OSError, ValueError):
        return {}


def _eval_data(session: Session, ev_art: Artifact | None) -> dict | None:
    """The data evaluate measured on: its artifact and, when it is a dataset's, the dataset
    by name (people know their data by name; the artifact id only finds it)."""
    if ev_art is None:
        return None
    ins = [a for a in session.scalars(select(Artifact).where(
        Artifact.id.in_(ev_art.inputs or []))) if a.kind in ("dataset", "tokenized")]
    if not ins:
        return None
    def dataset_of(ids: list[str]) -> dict | None:
        ds = session.scalars(select(Dataset).where(Dataset.artifact_id.in_(ids))).first()
        return {"id": ds.id, "name": ds.name} if ds is not None else None

    # A part of a dataset (the split's held-out records, a prepare's rows of it) is named by
    # the dataset it was made from.
    return {"artifact_id": ins[0].id, "kind": ins[0].kind, "dataset": dataset_of([ins[0].id]),
            "made_from": dataset_of(list(ins[0].inputs or []))}


def _per_position(rep: dict) -> dict[str, list[float]]:
    """Acceptance per draft position, for every measure the report has."""
    base = rep.get("baseline") or {}
    out = {"trained": rep.get("acceptance_rate_per_position") or rep.get("per_position"),
           "untrained": base.get("acceptance_rate_per_position"),
           "trained_sim": rep.get("acceptance_rate_per_position_sim"),
           "untrained_sim": base.get("acceptance_rate_per_position_sim"),
           "vllm": (rep.get("vllm") or {}).get("acceptance_rate_per_position"),
           "prompt_lookup": (rep.get("prompt_lookup") or {}).get("acceptance_rate_per_position")}
    return {k: [float(x) for x in v] for k, v in out.items()
            if isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v)}


def _curves(session: Session, job_id: str | None) -> dict[str, list]:
    if not job_id:
        return {}
    series = jobs.metrics(session, job_id)
    return {k: v for k, v in series.items() if k.startswith(CURVE_PREFIXES)}


def build_report(session: Session, run: Run) -> dict[str, Any]:
    js = run_jobs(session, run.id)
    spec = run.spec or {}
    # A stage satisfied by reuse (app/scheduler/service.py _reuse) made nothing itself: its
    # outputs are the earlier job's artifacts, so a job's artifacts are its outputs.
    stage_of_art = {a: j.run_stage for j in js for a in j.outputs or []}
    arts: list[Artifact] = list(session.scalars(
        select(Artifact).where(Artifact.producer_job.in_([j.id for j in js])
                               | Artifact.id.in_(stage_of_art))
        .order_by(Artifact.created_at))) if js else []
    target_id, dataset_id = spec.get("target_id"), spec.get("dataset_id")
    # The run's input dataset is the root of its lineage, though no job of the run made it.
    ds = session.get(Dataset, dataset_id) if dataset_id else None
    root = session.get(Artifact, ds.artifact_id) if ds is not None and ds.artifact_id else None
    if root is not None and root not in arts:
        arts.insert(0, root)
    by_id = {a.id: a for a in arts}
    targets = _names(session, Target, {target_id})
    datasets = _names(session, Dataset, {dataset_id})
    users = _names(session, User, {run.owner_id, *(j.owner_id for j in js)})
    stage_of: dict = {j.id: j.run_stage for j in js}
    # The machine each artifact was made on, the run's input's ingest included.
    node_of: dict = dict(session.execute(select(Job.id, Job.node).where(
        Job.id.in_({a.producer_job for a in arts if a.producer_job}))).tuples().all())

    def template_sha(a: Artifact, seen: frozenset = frozenset()) -> str | None:
        """The chat template an artifact was made with: its own record, else its inputs'."""
        sha = (a.meta or {}).get("chat_template_sha256")
        if sha:
            return sha
        for i in a.inputs or []:
            if i in by_id and i not in seen:
                got = template_sha(by_id[i], seen | {a.id})
                if got:
                    return got
        return None

    lineage = [{"id": a.id, "kind": a.kind,
                "stage": (stage_of_art.get(a.id) or stage_of.get(a.producer_job)
                          or ("input" if a is root else None)),
                "job_id": a.producer_job, "node": node_of.get(a.producer_job),
                # The artifacts it was made from (the target has its own field).
                "inputs": [i for i in a.inputs or [] if i != target_id], "bytes": a.bytes,
                "created_at": a.created_at,
                "dataset": {"id": dataset_id, "name": datasets.get(dataset_id)},
                "target": {"id": target_id, "name": targets.get(target_id)},
                "chat_template_sha256": template_sha(a)} for a in arts]

    pairs = drafter_jobs(js)
    views = {name: _drafter_view(session, run, arts, tr, ev) for name, (tr, ev) in pairs.items()}
    compared = compare(pairs, views) if None not in pairs else None
    # One drafter: its view; several: the best-ranked one's, the ranking beside it.
    view = views.get(None) or (views[compared[0]["name"]] if compared else _drafter_view(
        session, run, arts, None, None))
    return {
        "run": {"id": run.id, "name": run.name, "status": run.status,
                "owner": {"id": run.owner_id, "name": users.get(run.owner_id)},
                "created_at": run.created_at, "finished_at": run.finished_at,
                "drafter_type": (spec.get("drafter") or {}).get("type"), "mode": spec.get("mode"),
                **({"drafters": [r["name"] for r in compared]} if compared else {})},
        "target": {"id": target_id, "name": targets.get(target_id)},
        "dataset": {"id": dataset_id, "name": datasets.get(dataset_id)},
        "stages": [{"stage": j.run_stage, "job_id": j.id, "status": j.status,
                    "attempt": j.attempt, "node": j.node,
                    "owner": {"id": j.owner_id, "name": users.get(j.owner_id)},
                    "error": j.error, "reused_from": j.reused_from,
                    "started_at": j.started_at, "finished_at": j.finished_at} for j in js],
        **{k: view[k] for k in ("evaluation", "per_position", "curves", "plots", "drafter")},
        # Several drafters (contracts/run.py `drafters`), best first (app/runs/compare.py).
        **({"drafters": compared} if compared else {}),
        "lineage": lineage,
    }


def _drafter_view(session: Session, run: Run, arts: list[Artifact], tr_job: Job | None,
                  ev_job: Job | None) -> dict[str, Any]:
    """One drafter's part of the report: its evaluation, acceptance per position, training
    curves, evaluate plots and drafter artifact."""
    ev_art = next((a for a in arts if ev_job and a.id in (ev_job.outputs or [])
                   and a.kind == "eval_report"), None)
    drafter = next((a for a in arts if tr_job and a.id in (tr_job.outputs or [])
                    and a.kind == "drafter"), None)
    rep = _eval_report(ev_art)
    own = (run.report or {}) if ev_job is not None and ev_job.run_stage == "evaluate" else {}
    summary = {**((ev_job.metrics_summary or {}) if ev_job else {}), **own}
    evaluation = {k: rep.get(k, summary.get(k)) for k in EVAL_KEYS}
    evaluation["tau_baseline"] = evaluation["tau_baseline"] or (rep.get("baseline") or {}).get("tau")
    evaluation["tau_sim_baseline"] = (evaluation["tau_sim_baseline"]
                                      or (rep.get("baseline") or {}).get("tau_sim"))
    evaluation["data"] = _eval_data(session, ev_art)
    # tau per source dataset when the evaluation set mixes sources (workers/stages/evaluate)
    evaluation["by_source"] = rep.get("by_source")
    evaluation["tau_prompt_lookup"] = (evaluation["tau_prompt_lookup"]
                                       or (rep.get("prompt_lookup") or {}).get("tau"))
    files = {f["path"] for f in (ev_art.files if ev_art else [])}
    curve_job = (tr_job.reused_from or tr_job.id) if tr_job else None
    return {
        "evaluation": evaluation,
        "per_position": _per_position(rep),
        # A reused train's curves are those of the job that trained (its events hold them).
        "curves": {"job_id": curve_job, "x": "step", "series": _curves(session, curve_job)},
        "plots": [{"artifact_id": ev_art.id, "path": p,
                   "url": f"/v1/artifacts/{ev_art.id}/files/{p}"}
                  for p in PLOT_FILES if ev_art and p in files],
        "drafter": ({"artifact_id": drafter.id, "uri": drafter.uri,
                     "serve_command": (drafter.meta or {}).get("vllm_serve_command"),
                     "steps": (drafter.meta or {}).get("steps"),
                     "final_loss": (drafter.meta or {}).get("final_loss"),
                     "bytes": drafter.bytes, "parameters": stored_parameters(drafter.uri)}
                    if drafter else None),
    }
