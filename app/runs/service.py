"""Runs: the whole pipeline in one submission, a chain of jobs each waiting for the one before
(generate -> prepare -> extract -> train -> evaluate; generate and extract can be skipped)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.auth import Principal
from app.core.db import utcnow
from app.core.errors import Conflict, Forbidden, Invalid, NotFound
from app.core.ids import new_id
from app.core.pagination import Page, paginate
from app.jobs import service as jobs
from app.jobs.lifecycle import StatusChanged
from app.jobs.params import validate_params
from app.jobs.render import job_models
from app.jobs.schemas import JobCreate
from app.jobs.states import LEASED, TERMINAL
from app.jobs.states import JobStatus as S
from app.models import Dataset, Job, Run, Target
from app.runs.schemas import RunRead, RunStage
from app.webhooks.service import on_run_status
from contracts.jobtypes import JobType
from contracts.run import STAGE_ORDER, RunSpec, RunSpecError, StageJob


def check_params(body: RunSpec) -> list[StageJob]:
    """The run's jobs (the one expansion, contracts/run.py), every stage's params valid (422
    naming the first bad field, as the run spells it: stages.<stage>.<field>), in
    microseconds: done before the plan, which takes seconds."""
    try:
        chain = body.expand()
    except RunSpecError as e:
        raise Invalid(e.message, param=e.param, code="invalid_run") from None
    for job in chain:
        try:
            validate_params(job.stage, job.params)
        except Invalid as e:
            where = (e.param or "params").removeprefix("params")
            raise Invalid(f"{_job_label(job)}: {e.message}", param=body.field_of(job.key, where),
                          code=e.code, details=e.details) from None
    return chain


def _job_label(job: StageJob) -> str:
    return f"stages.{job.stage}" + (f" of drafter {job.drafter}" if job.drafter else "")


def create_run(session: Session, user: Principal, body: RunSpec,
               chain: list[StageJob]) -> Run:
    """The run and its chain of jobs, `chain` as `check_params(body)` returned it."""
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
    for sj in chain:
        resolved = {k: (stage_ref(made, v) if isinstance(v, str) and v.startswith("@") else v)
                    for k, v in sj.inputs.items()}
        try:
            job = jobs.create_job(session, user, JobCreate(
                type=JobType(sj.stage), name=f"{body.name}: {sj.key}",
                priority=body.priority, gpus=sj.gpus, inputs=resolved, params=sj.params,
                force=body.force, keep=body.keep),
                run_id=run.id, run_stage=sj.key, validate_params=validate_params)
        except Invalid as e:  # the plan refuses it first; force_plan does not make weights
            if e.code != "target_has_no_weights":
                raise
            raise Invalid(f"target_id: stages.{sj.stage}: {e.message.removeprefix('inputs.target: ')}",
                          param="target_id", code=e.code, details=e.details) from None
        made[sj.key] = job.id
    return run


def stage_ref(made: dict[str, str], ref: str) -> dict[str, str]:
    """`@key` or `@key.output` (contracts/run.py) as a job reference."""
    key, _, output = ref[1:].partition(".")
    return {"job": made[key], **({"output": output} if output else {})}


def _in_order(js: list[Job]) -> list[Job]:
    """Stage order; the jobs of one stage (one per drafter) in the order they were made."""
    def rank(j: Job) -> tuple:
        stage = str(j.run_stage or "").partition(":")[0]
        return (STAGE_ORDER.index(stage) if stage in STAGE_ORDER else 99, j.created_at, j.id)
    return sorted(js, key=rank)


def run_jobs(session: Session, run_id: str) -> list[Job]:
    return _in_order(list(session.scalars(select(Job).where(Job.run_id == run_id))))


def overall_status(statuses: list[str]) -> str:
    """A run's status (docs/API.md: pending, queued, running, succeeded, failed, cancelled) from
    its stage jobs' statuses."""
    if not statuses:
        return "pending"
    if all(s == S.succeeded for s in statuses):
        return "succeeded"
    if any(s in LEASED for s in statuses):
        return "running"
    if any(s == S.failed for s in statuses):
        return "failed"
    if any(s == S.cancelled for s in statuses):
        return "cancelled"
    if any(s == S.succeeded for s in statuses):
        return "running"
    return "queued" if any(s == S.queued for s in statuses) else "pending"


def refresh_run(session: Session, run_id: str) -> Run | None:
    run = session.get(Run, run_id)
    if run is None:
        return None
    js = run_jobs(session, run_id)
    old = run.status
    run.status = overall_status([j.status for j in js])
    if run.status in TERMINAL:  # a run's final statuses are its jobs'
        run.finished_at = run.finished_at or utcnow()
    else:
        run.finished_at = None
    evs = [j for j in js if j.type == "evaluate" and j.status == S.succeeded and j.outputs]
    if len(evs) == 1 and evs[0].run_stage == "evaluate":
        run.report = {"artifact_id": evs[0].outputs[0], **(evs[0].metrics_summary or {})}
    elif evs:  # several drafters (contracts/run.py): each one's summary, best tau first
        run.report = {"drafters": ranked([{
            "drafter": str(j.run_stage).partition(":")[2], "artifact_id": j.outputs[0],
            **(j.metrics_summary or {})} for j in evs])}
    on_run_status(session, run, old, run.status)  # the owner's webhooks (outbox, same transaction)
    return run


def ranked(rows: list[dict], name: str = "drafter") -> list[dict]:
    """Drafters best first: by tau (none last), then by `name`."""
    return sorted(rows, key=lambda r: (-(r["tau"]) if isinstance(r.get("tau"), (int, float))
                                       else float("inf"), str(r.get(name))))


def on_job_status(session: Session, ev: StatusChanged) -> None:
    """Subscriber (app/wiring.py): a run's status follows its stage jobs."""
    if ev.job.run_id:
        refresh_run(session, ev.job.run_id)


def list_runs(session: Session, page: Page):
    return paginate(session, select(Run), Run.id, page)


def get_run(session: Session, run_id: str) -> Run:
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound(f"run {run_id} not found", param="id")
    return run


def cancel_run(session: Session, user: Principal, run: Run) -> Run:
    if not (user.is_admin or run.owner_id == user.id):
        raise Forbidden(f"only the owner of {run.id} or an admin may cancel it", code="not_owner")
    for j in run_jobs(session, run.id):
        if j.status not in TERMINAL:
            jobs.cancel_job(session, user, j, check_owner=False)
    session.flush()
    refresh_run(session, run.id)
    return run


def retry_run(session: Session, user: Principal, run: Run) -> Run:
    """Rerun from the failed or cancelled stages; succeeded stages keep their artifacts."""
    if not (user.is_admin or run.owner_id == user.id):
        raise Forbidden(f"only the owner of {run.id} or an admin may retry it", code="not_owner")
    todo = [j for j in run_jobs(session, run.id) if j.status in (S.failed, S.cancelled)]
    if not todo:
        raise Conflict(f"run {run.id} has no failed or cancelled stage to retry",
                       code="not_retryable", details={"status": run.status})
    for j in todo:
        jobs.retry_job(session, user, j)
    session.flush()
    refresh_run(session, run.id)
    return run


def run_model(session: Session, run: Run) -> RunRead:
    return run_models(session, [run])[0]


def run_models(session: Session, runs: list[Run]) -> list[RunRead]:
    """Runs with their jobs: one query for all the runs' jobs and one for their GPUs, however
    many runs (GET /v1/runs made two per run)."""
    by_run: dict[str, list[Job]] = {r.id: [] for r in runs}
    if runs:
        for j in session.scalars(select(Job).where(Job.run_id.in_(list(by_run)))):
            by_run[str(j.run_id)].append(j)
    reads = iter(job_models(session, [j for r in runs for j in _in_order(by_run[r.id])]))
    out = []
    for run in runs:
        js = _in_order(by_run[run.id])
        out.append(RunRead(
            id=run.id, name=run.name, owner=run.owner_id, status=run.status, spec=run.spec,
            jobs=[next(reads) for _ in js],
            stages={str(j.run_stage): RunStage(job_id=j.id, status=j.status, progress=j.progress,
                                               reused_from=j.reused_from, error=j.error)
                    for j in js},
            report=run.report, created_at=run.created_at, finished_at=run.finished_at))
    return out
