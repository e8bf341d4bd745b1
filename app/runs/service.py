"""Runs: the whole pipeline in one submission, a chain of jobs each waiting for the one before
(generate -> prepare -> extract -> train -> evaluate; generate and extract can be skipped)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.auth import Principal
from app.core.db import utcnow
from app.core.errors import Conflict, Forbidden, Invalid, NotFound
from app.core.ids import new_id
from app.jobs import service as jobs
from app.jobs.params import validate_params
from app.jobs.render import jobs_read
from app.jobs.schemas import JobCreate, JobType
from app.models import Artifact, Dataset, Job, Run, Target

STAGE_ORDER = ("generate", "prepare", "extract", "train", "evaluate")


def _kwargs_of(stage: dict | None) -> dict:
    return dict((stage or {}).get("chat_template_kwargs") or {})


def build_chain(body) -> list[tuple[str, dict, dict, int]]:
    """(stage, inputs, params, gpus) in order; inputs name earlier stages as `@stage`."""
    st = body.stages
    drafter = body.drafter.model_dump(exclude_none=True)
    chain: list[tuple[str, dict, dict, int]] = []
    data_ref: Any = body.dataset_id
    # One thinking mode for the whole run unless a stage says otherwise: generate, prepare
    # and evaluate must agree (FIELD-NOTES: mismatched thinking mode collapses acceptance).
    kw = body.chat_template_kwargs or {}
    if st.generate is not None:
        p = {**st.generate}
        p["chat_template_kwargs"] = {**kw, **_kwargs_of(st.generate)}
        chain.append(("generate", {"dataset": data_ref, "target": body.target_id}, p,
                      int(p.pop("gpus", 0) or 0)))
        data_ref = "@generate"
    p = {**(st.prepare or {})}
    p["chat_template_kwargs"] = {**kw, **_kwargs_of(st.prepare)}
    if body.drafter.draft_vocab_size and "draft_vocab_size" not in p:
        p["draft_vocab_size"] = body.drafter.draft_vocab_size
    chain.append(("prepare", {"dataset": data_ref, "target": body.target_id}, p,
                  int(p.pop("gpus", 0) or 0)))
    if body.mode == "offline":
        p = {**(st.extract or {})}
        p.setdefault("drafter_type", body.drafter.type)
        if body.drafter.target_layer_ids and "layer_ids" not in p:
            p["layer_ids"] = body.drafter.target_layer_ids
        chain.append(("extract", {"tokenized": "@prepare", "target": body.target_id}, p,
                      int(p.pop("gpus", 0) or 0)))
    p = {**(st.train or {})}
    p["mode"] = body.mode
    p["drafter"] = {**drafter, **(p.get("drafter") or {})}
    tin = {"tokenized": "@prepare", "target": body.target_id}
    if body.mode == "offline":
        tin["hidden_states"] = "@extract"
    chain.append(("train", tin, p, int(p.pop("gpus", 0) or 0)))
    if st.evaluate is not None:
        p = {**st.evaluate}
        p["chat_template_kwargs"] = {**kw, **_kwargs_of(st.evaluate)}
        ein = {"target": body.target_id, "drafter": "@train",
               "data": p.pop("data", None) or "@prepare"}
        chain.append(("evaluate", ein, p, int(p.pop("gpus", 0) or 0)))
    return chain


def check_params(body) -> None:
    """Every stage's params valid (422 naming the first bad field), in microseconds: done
    before the plan, which takes seconds."""
    for stage, _inputs, params, _gpus in build_chain(body):
        try:
            validate_params(stage, params)
        except Invalid as e:  # named as the run spells it: stages.<stage>.<field>
            where = (e.param or "params").removeprefix("params")
            raise Invalid(f"stages.{stage}: {e.message}", param=f"stages.{stage}{where}",
                          code=e.code, details=e.details) from None


def create_run(session: Session, user: Principal, body) -> Run:
    """The run and its chain of jobs; `check_params(body)` first (the route does)."""
    if session.get(Target, body.target_id) is None:
        raise Invalid(f"target_id: {body.target_id} not found", param="target_id",
                      code="unknown_input")
    ds = session.get(Dataset, body.dataset_id)
    if ds is None:
        raise Invalid(f"dataset_id: {body.dataset_id} not found", param="dataset_id",
                      code="unknown_input")
    if ds.status == "failed":
        raise Conflict(f"dataset {ds.id} failed to ingest", code="dataset_failed",
                       param="dataset_id")
    run = Run(id=new_id("run"), name=body.name, owner_id=user.id,
              spec=body.model_dump(mode="json"), status="pending")
    session.add(run)
    session.flush()
    made: dict[str, str] = {}
    for stage, inputs, params, gpus in build_chain(body):
        resolved = {k: ({"job": made[v[1:]]} if isinstance(v, str) and v.startswith("@") else v)
                    for k, v in inputs.items()}
        job = jobs.create_job(session, user, JobCreate(
            type=JobType(stage), name=f"{body.name}: {stage}", priority=body.priority,
            gpus=gpus, inputs=resolved, params=params, force=body.force),
            run_id=run.id, run_stage=stage, validate_params=validate_params)
        made[stage] = job.id
    return run


def run_jobs(session: Session, run_id: str) -> list[Job]:
    js = list(session.scalars(select(Job).where(Job.run_id == run_id)))
    return sorted(js, key=lambda j: STAGE_ORDER.index(j.run_stage) if j.run_stage in STAGE_ORDER else 99)


def overall_status(statuses: list[str]) -> str:
    if not statuses:
        return "pending"
    if all(s == "succeeded" for s in statuses):
        return "succeeded"
    if any(s in ("running", "dispatched", "cancelling") for s in statuses):
        return "running"
    if any(s == "failed" for s in statuses):
        return "failed"
    if any(s == "cancelled" for s in statuses):
        return "cancelled"
    if any(s == "succeeded" for s in statuses):
        return "running"
    return "queued" if any(s == "queued" for s in statuses) else "pending"


def refresh_run(session: Session, run_id: str) -> Run | None:
    run = session.get(Run, run_id)
    if run is None:
        return None
    js = run_jobs(session, run_id)
    old = run.status
    run.status = overall_status([j.status for j in js])
    if run.status in ("succeeded", "failed", "cancelled"):
        run.finished_at = run.finished_at or utcnow()
    else:
        run.finished_at = None
    ev = next((j for j in js if j.run_stage == "evaluate" and j.status == "succeeded"), None)
    if ev is not None and ev.outputs:
        art = session.get(Artifact, ev.outputs[0])
        run.report = {"artifact_id": art.id if art else None, **(ev.metrics_summary or {})}
    _notify_webhooks(session, run, old)
    return run


def _notify_webhooks(session: Session, run: Run, old: str | None) -> None:
    """Subscriber: the owner's webhooks hear of a run's end (outbox rows, same transaction)."""
    from app.webhooks.service import on_run_status

    on_run_status(session, run, old, run.status)


def get_run(session: Session, run_id: str) -> Run:
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound(f"run {run_id} not found", param="id")
    return run


def cancel_run(session: Session, user: Principal, run: Run) -> Run:
    if not (user.is_admin or run.owner_id == user.id):
        raise Forbidden(f"only the owner of {run.id} or an admin may cancel it", code="not_owner")
    for j in run_jobs(session, run.id):
        if j.status not in ("succeeded", "failed", "cancelled"):
            jobs.cancel_job(session, user, j, check_owner=False)
    session.flush()
    refresh_run(session, run.id)
    return run


def retry_run(session: Session, user: Principal, run: Run) -> Run:
    """Rerun from the failed or cancelled stages; succeeded stages keep their artifacts."""
    if not (user.is_admin or run.owner_id == user.id):
        raise Forbidden(f"only the owner of {run.id} or an admin may retry it", code="not_owner")
    todo = [j for j in run_jobs(session, run.id) if j.status in ("failed", "cancelled")]
    if not todo:
        raise Conflict(f"run {run.id} has no failed or cancelled stage to retry",
                       code="not_retryable", details={"status": run.status})
    for j in todo:
        jobs.retry_job(session, user, j)
    session.flush()
    refresh_run(session, run.id)
    return run


def run_read(session: Session, run: Run) -> dict:
    js = run_jobs(session, run.id)
    return {"id": run.id, "name": run.name, "owner": run.owner_id, "status": run.status,
            "spec": run.spec, "jobs": jobs_read(session, js),
            "stages": {j.run_stage: {"job_id": j.id, "status": j.status, "progress": j.progress,
                                     "reused_from": j.reused_from, "error": j.error}
                       for j in js},
            "report": run.report, "created_at": run.created_at, "finished_at": run.finished_at}
