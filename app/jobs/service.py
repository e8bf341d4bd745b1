"""Job rules: creation with input checks, the state machine, cancel, retry, events."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from pydantic import ValidationError
from sqlalchemy import Connection, Table, select, text, update
from sqlalchemy.orm import Session

from app.core.auth import Principal
from app.core.config import get_settings
from app.core.db import is_sqlite, rowcount, utcnow
from app.core.errors import ApiError, Conflict, Forbidden, Invalid, NotFound
from app.core.ids import new_id
from app.core.pagination import Page, paginate
from app.core.paths import resolve_inside
from app.jobs.inputs import InputDeleted, Unresolved, resolve_ref
from app.jobs.lifecycle import announce, queue_changed
from app.jobs.preemption import recent
from app.jobs.schemas import JobCreate
from app.jobs.states import LEASED, TERMINAL, IllegalTransition, JobStatus, check
from app.models import Artifact, Dataset, Gpu, GpuLease, Job, JobEvent, Target, User
from app.storage.reserve import check_quota
from app.users.service import check_priority
from contracts.jobtypes import JOB_TYPES, NEEDS_TARGET_WEIGHTS, RESUMABLE
from contracts.target import has_weights

S = JobStatus


# ---- events and transitions -------------------------------------------------------------

def add_event(session: Session, job_id: str, kind: str, data: dict,
              at: datetime | None = None) -> None:
    """Recorded as of now (or `at`), not of the next flush: the events of one flush then
    have the same columns set and are written in one statement."""
    session.add(JobEvent(job_id=job_id, kind=kind, data=data, at=at or utcnow()))


def transition(session: Session, job: Job, new: S, *, reason: str | None = None,
               **fields: Any) -> None:
    """Move `job` to `new` (checked), set fields, record a status event, free its GPUs if it
    leaves an active state, and announce the change (app/jobs/lifecycle.py). The only way a
    job's status changes, with its bulk twins `cas_status` and `dispatched` below."""
    try:
        check(job.status, new)
    except IllegalTransition as e:
        raise Conflict(f"job {job.id} is {job.status}; it cannot become {new}",
                       code="illegal_transition", details={"status": job.status}) from e
    old = job.status
    job.status = new.value
    now = utcnow()
    if new == S.queued:
        job.queued_at = job.queued_at or now
    if new in TERMINAL:
        job.finished_at = now
        job.pending_reason = None
        job.queue_position = None
    for k, v in fields.items():
        setattr(job, k, v)
    data = {"from": old, "to": new.value}
    if reason:
        data["reason"] = reason
    add_event(session, job.id, "status", data)
    _after(session, job, old, new)


def _after(session: Session, job: Job, old: str, new: S) -> None:
    """What every status change does once the row says `new`: a job leaving an active state
    gives its GPUs back (before the subscribers run: the scheduler they wake sees them free),
    then the change is announced."""
    if old in LEASED and new not in LEASED:
        _release_gpus(session, job.id)
    announce(session, job, old, new.value)


def cas_status(session: Session, job_id: str, old: S, new: S, **fields: Any) -> bool:
    """Compare-and-set: change status only if it is still `old` (duplicate deliveries, races
    with cancel). Returns whether this caller won."""
    check(old, new)
    res = session.execute(update(Job).where(Job.id == job_id, Job.status == old.value)
                          .values(status=new.value, **fields))
    if rowcount(res) != 1:
        return False
    add_event(session, job_id, "status", {"from": old.value, "to": new.value})
    job = session.get(Job, job_id)  # the ORM update above synchronised it if it was loaded
    if job is not None:
        _after(session, job, old.value, new)
    return True


# dispatched -> running and the status event in one statement, for the node that took the
# message: a GPU job only on the node that holds its GPUs, a CPU job on any. Returns the job's
# row as it now is (none: nothing to claim), so announcing the change reads nothing more.
_CLAIM_PG = text("""
WITH j AS (UPDATE jobs SET status = :to, node = :node, worker = :worker, started_at = :now,
                           heartbeat_at = :now, preempt_by = NULL
           WHERE id = :id AND status = :from AND (gpus_requested = 0 OR node = :node)
           RETURNING *),
e AS (INSERT INTO job_events (job_id, at, kind, data)
      SELECT :id, :now, 'status', CAST(:data AS json) FROM j)
SELECT * FROM j""").columns(*cast(Table, Job.__table__).c)
_CLAIMED_JOB = select(Job).from_statement(_CLAIM_PG).execution_options(populate_existing=True)


def claim(session: Session, job_id: str, node: str, *, worker: str, now: datetime) -> bool:
    """dispatched -> running, once, for the worker on `node` that took the job's message:
    a duplicate delivery, a stale one for another node, or a job cancelled since it was
    dispatched finds nothing to claim (False). preempt_by is cleared: a request to yield was
    for the attempt before this one."""
    old, new = S.dispatched, S.running
    check(old, new)
    if is_sqlite(session):
        job = session.get(Job, job_id)
        if job is None or (job.gpus_requested and job.node != node):
            return False
        return cas_status(session, job_id, old, new, started_at=now, heartbeat_at=now,
                          node=node, worker=worker, preempt_by=None)
    data = json.dumps({"from": old.value, "to": new.value})
    job = session.scalars(_CLAIMED_JOB, {"id": job_id, "from": old.value, "to": new.value,
                                         "node": node, "worker": worker, "now": now,
                                         "data": data}).first()
    if job is None:
        return False
    _after(session, job, old.value, new)
    return True


def dispatched(session: Session, jobs: list[Job]) -> None:
    """Announce queued -> dispatched for jobs the scheduler moved in bulk (one conditional
    statement per job, which also wrote their status event and leases, and returned the
    job's row as it now is: app/scheduler/service.py `_dispatch`)."""
    for job in jobs:
        announce(session, job, S.queued.value, S.dispatched.value)


# ---- creation ---------------------------------------------------------------------------

def _ref_exists(session: Session, ref: Any, name: str, kinds: tuple[str, ...]) -> str | None:
    """Check one input reference; return the job id it depends on, if any."""
    if isinstance(ref, dict) and set(ref) <= {"job", "output"} and "job" in ref:
        dep = session.get(Job, ref["job"])
        if dep is None:
            raise Invalid(f"inputs.{name}: job {ref['job']} does not exist", param=f"inputs.{name}",
                          code="unknown_input")
        if dep.status == S.succeeded.value:
            _not_deleted(session, ref, name, kinds)
        return dep.id
    if isinstance(ref, dict) and "artifact" in ref:
        ref = ref["artifact"]
    if not isinstance(ref, str):
        raise Invalid(f"inputs.{name}: expected an id (ds_, art_, tgt_) or {{\"job\": \"job_...\"}}",
                      param=f"inputs.{name}", code="invalid_input")
    if ref.startswith("tgt_") and "target" in kinds:
        ok = session.get(Target, ref) is not None
    elif ref.startswith("ds_") and "dataset" in kinds:
        ds = session.get(Dataset, ref)
        ok = ds is not None
        if ds is not None and ds.status == "failed":
            raise Invalid(f"inputs.{name}: dataset {ref} failed to ingest", param=f"inputs.{name}",
                          code="dataset_failed")
        if ds is not None and ds.artifact_id is None and ds.job_id:
            return ds.job_id  # still ingesting: wait for it
        if ds is not None:
            _not_deleted(session, ref, name, kinds)
    elif ref.startswith("art_"):
        art = session.get(Artifact, ref)
        ok = art is not None
        if art is not None:
            _not_deleted(session, ref, name, kinds)
        if art is not None and art.kind not in kinds:
            raise Invalid(f"inputs.{name}: {ref} is a {art.kind} artifact; expected "
                          f"{' or '.join(kinds)}", param=f"inputs.{name}", code="wrong_input_kind")
    elif ref.startswith("job_"):
        return _ref_exists(session, {"job": ref}, name, kinds)
    else:
        raise Invalid(f"inputs.{name}: {ref!r} is not a valid reference for {'/'.join(kinds)}",
                      param=f"inputs.{name}", code="invalid_input")
    if not ok:
        raise Invalid(f"inputs.{name}: {ref} does not exist", param=f"inputs.{name}",
                      code="unknown_input")
    return None


def check_reference(session: Session, ref: Any, param: str, kinds: tuple[str, ...]) -> None:
    """One reference checked as a job's input is at submit (it exists, is of a kind in
    `kinds`, did not fail or get deleted), the error naming `param` as the caller spells the
    field (a run body's `stages.evaluate.data`): a plan checks with it what submit will."""
    try:
        _ref_exists(session, ref, param, kinds)
    except ApiError as e:
        e.message, e.param = e.message.removeprefix("inputs."), param
        e.args = (e.message,)
        raise


def _not_deleted(session: Session, ref: Any, name: str, kinds: tuple[str, ...]) -> None:
    """A tombstoned input is refused at submit, naming it (app/storage/delete.py)."""
    try:
        resolve_ref(session, ref, kinds)
    except InputDeleted as e:
        raise Conflict(f"inputs.{name}: {e}", param=f"inputs.{name}",
                       code="input_deleted") from None
    except Unresolved:
        pass  # the other checks here say what is wrong


def _check_shape(type_: str, inputs: dict) -> None:
    try:
        JOB_TYPES[type_].inputs.model_validate(inputs)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        raise Invalid(f"inputs.{loc}: {err.get('msg')}", param=f"inputs.{loc}",
                      code="invalid_input") from e


def ingest_source(raw: str) -> Path:
    """An ingest's source file: inside DRAFTYARD_DATA_ROOTS, or an upload this server stored."""
    s = get_settings()
    path = resolve_inside(raw, s.roots("data") + [s.uploads_dir.resolve()], what="data",
                          param="inputs.source.path", env="DRAFTYARD_DATA_ROOTS")
    if not path.is_file():
        raise Invalid(f"inputs.source.path: {raw} is not a file", param="inputs.source.path",
                      code="not_a_file")
    return path


def _target_of(session: Session, ref: Any, via: list[str]) -> Target | None:
    """The target a `target` input names: a tgt_ id, or, through `{"job": id}`, that job's
    own target (appending the jobs followed to `via`); None when there is none to check."""
    if isinstance(ref, dict) and "job" in ref:
        ref = ref["job"]
    if isinstance(ref, str) and ref.startswith("tgt_"):
        return session.get(Target, ref)
    if isinstance(ref, str) and ref.startswith("job_") and ref not in via and len(via) < 8:
        dep = session.get(Job, ref)
        if dep is not None:
            via.append(ref)
            return _target_of(session, (dep.inputs or {}).get("target"), via)
    return None


def check_target_weights(session: Session, type_: str, inputs: dict) -> None:
    """A type that loads its target's weights (contracts/jobtypes.py `target_weights`, the
    rule the run's plan applies too) is refused on a config-only target at submit, not
    later on a worker."""
    why = NEEDS_TARGET_WEIGHTS.get(type_)
    via: list[str] = []
    t = _target_of(session, inputs.get("target"), via) if why else None
    if t is None or has_weights(t.path):
        return
    through = f", through job {' -> '.join(via)}" if via else ""
    raise Invalid(
        f"inputs.target: {type_} {why}: target '{t.name}' ({t.id}{through}) has no weights "
        f"(config only); register it from a folder with its weights ({', '.join(NEEDS_TARGET_WEIGHTS)} "
        f"load them, details.needs_weights says why; prepare needs only the tokenizer)",
        param="inputs.target", code="target_has_no_weights",
        details={"target_id": t.id, "target_name": t.name, "type": type_, "reason": why,
                 "via_jobs": via, "needs_weights": dict(NEEDS_TARGET_WEIGHTS)})


def check_inputs(session: Session, type_: str, inputs: dict) -> list[str]:
    allowed = JOB_TYPES[type_].accepts
    for req in JOB_TYPES[type_].required:
        if req not in inputs:
            raise Invalid(f"a {type_} job needs inputs.{req}", param=f"inputs.{req}",
                          code="missing_input")
    for name in inputs:
        if name not in allowed:
            raise Invalid(f"unknown input '{name}' for a {type_} job; allowed: "
                          f"{', '.join(allowed) or 'none'}", param=f"inputs.{name}",
                          code="unknown_input")
    _check_shape(type_, inputs)
    if type_ == "ingest":
        # The one file an ingest reads goes through the same root check as every other
        # path a client names; the stored path is the checked real one.
        inputs["source"]["path"] = str(ingest_source(inputs["source"]["path"]))
        return []
    deps: list[str] = []
    for name, ref in inputs.items():
        refs = ref if isinstance(ref, list) else [ref]
        for r in refs:
            if isinstance(r, dict) and "dataset_id" in r:  # mix sources
                r = r["dataset_id"]
            dep = _ref_exists(session, r, name, allowed[name])
            if dep and dep not in deps:
                deps.append(dep)
    check_target_weights(session, type_, inputs)
    return deps


def create_job(session: Session, user: Principal, body: JobCreate, *, run_id: str | None = None,
               run_stage: str | None = None, validate_params=None) -> Job:
    check_priority(session, user, body.priority)
    if body.gpus and not JOB_TYPES[body.type.value].gpu:
        raise Invalid(f"a {body.type.value} job runs on CPU only: gpus must be 0 (GPU types: "
                      f"{', '.join(n for n, d in JOB_TYPES.items() if d.gpu)})", param="gpus",
                      code="cpu_only_type")
    preemptible = _preemptible(user, body.type.value, body.preemptible)
    check_quota(session, user.id, user.name, f"a new {body.type.value} job")
    if validate_params is not None:
        body.params = validate_params(body.type.value, body.params)
    deps = check_inputs(session, body.type.value, body.inputs)
    now = utcnow()  # the row is flushed at the end: created, and its first event, now
    job = Job(id=new_id("job"), type=body.type.value, name=body.name, owner_id=user.id,
              created_at=now,
              status=S.pending.value, priority=body.priority, gpus_requested=body.gpus,
              inputs=body.inputs, params=body.params, depends_on=deps, force=body.force,
              run_id=run_id, run_stage=run_stage, max_attempts=get_settings().max_attempts,
              preemptible=preemptible, keep=body.keep)
    # One flush at the end: a job without inputs to wait for is inserted already queued, its
    # status events in one statement (a flush right after add cost an INSERT and an UPDATE
    # more on every submit); a subscriber that reads the database flushes it earlier.
    session.add(job)
    add_event(session, job.id, "status", {"from": None, "to": S.pending.value}, at=now)
    announce(session, job, None, S.pending.value)  # created: a status change from nothing
    if deps:
        queue_changed(session)  # its inputs may be done already: a pass promotes it
    else:
        transition(session, job, S.queued)
    session.flush()
    return job


def _preemptible(user: Principal, type_: str, asked: bool | None) -> bool:
    """The preemption rule of contracts/jobtypes.py; only an admin may exempt a job of a type
    that is preemptible by default (else everyone would)."""
    by_default = JOB_TYPES[type_].preemptible_by_default
    if asked is None:
        return by_default
    if asked and type_ not in RESUMABLE:
        raise Invalid(f"a {type_} job cannot be preempted: it does not resume from a "
                      f"checkpoint (preemptible types: {', '.join(sorted(RESUMABLE))})",
                      param="preemptible", code="not_preemptible")
    if not asked and by_default and not user.is_admin:
        raise Forbidden(f"only an admin may mark a {type_} job non-preemptible",
                        param="preemptible", code="admin_only")
    return asked


def set_preemptible(session: Session, user: Principal, job: Job, preemptible: bool) -> Job:
    """Admins may exempt any job (or make it preemptible again); owners may only opt in."""
    if not preemptible and not user.is_admin:
        raise Forbidden("marking a job non-preemptible is an admin action", code="admin_only",
                        param="preemptible")
    _may_act(user, job)
    job.preemptible = _preemptible(user, job.type, preemptible)
    add_event(session, job.id, "status", {"preemptible": job.preemptible, "by": user.name})
    return job


def requeue_preempted(session: Session, job: Job) -> None:
    """A running job whose stage yielded to `job.preempt_by`: back to queued (its age kept,
    so it resumes first among its priority), attempt + 1, from its checkpoint."""
    by = session.get(Job, job.preempt_by) if job.preempt_by else None
    now = utcnow()
    info = {"by": job.preempt_by, "by_priority": by.priority if by else None,
            "by_owner": by.owner_id if by else None, "at": now.isoformat(),
            "attempt": job.attempt, "node": job.node,
            "reason": f"{job.preempt_by} (priority {by.priority if by else '?'}) needed the "
                      f"GPUs on {job.node}; this job has priority {job.priority}"}
    history = recent((job.preemption or {}).get("history"), now.timestamp())
    requeue(session, job, f"preempted by {job.preempt_by}", fault=False, preempt_by=None,
            preemption={**info, "history": history + [now.timestamp()]})
    add_event(session, job.id, "preempted", info)


def requeue(session: Session, job: Job, reason: str, *, fault: bool, **fields: Any) -> None:
    """A running (or lost) job back to queued as its next attempt, which resumes from what
    the last one saved (contracts/jobtypes.py `resumable`). `fault`: an infrastructure fault
    (a lost worker, a stage killed from outside) spends one of the job's `max_attempts`;
    otherwise (preempted, its worker stopped) the budget stays whole."""
    transition(session, job, S.queued, reason=reason, attempt=job.attempt + 1, node=None,
               started_at=None, progress=None, **fields)
    if not fault:
        job.max_attempts += 1


# How many times a job whose stage died by a signal nobody of ours sent (the kernel's OOM
# killer, an operator's kill) is retried: once, for a node that was short of memory for a
# moment; a stage that needs more than the node has would only die again.
OUTSIDE_KILL_RETRIES = 1
KILLED = "stage_killed"


def retry_killed(session: Session, job: Job, error: dict) -> bool:
    """Record a stage's death by an outside signal (a warning event with the signal and the
    memory figures of `error`, workers/runner.py) and requeue the job as an infrastructure
    fault when it is the first such death and attempts are left; False: the caller fails it
    with `error`."""
    before = sum(1 for data in session.scalars(
        select(JobEvent.data).where(JobEvent.job_id == job.id, JobEvent.kind == "warning"))
        if (data or {}).get("code") == KILLED)
    add_event(session, job.id, "warning", {"code": KILLED, "message": error["message"],
                                           **(error.get("details") or {})})
    if before >= OUTSIDE_KILL_RETRIES or job.attempt >= job.max_attempts:
        return False
    requeue(session, job, f"{error['message']}; retried once", fault=True)
    return True


# ---- reads ------------------------------------------------------------------------------

def get_job(session: Session, job_id: str) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found", param="id")
    return job


def list_jobs(session: Session, page: Page, *, status: str | None = None, type_: str | None = None,
              owner: str | None = None, run_id: str | None = None):
    stmt = select(Job)
    if status:
        stmt = stmt.where(Job.status.in_(status.split(",")))
    if type_:
        stmt = stmt.where(Job.type == type_)
    if owner:
        uid = owner if owner.startswith("usr_") else session.scalar(
            select(User.id).where(User.name == owner))
        stmt = stmt.where(Job.owner_id == uid)
    if run_id:
        stmt = stmt.where(Job.run_id == run_id)
    return paginate(session, stmt, Job.id, page)


def gpus_of(session: Session | Connection, job_ids: list[str]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    if not job_ids:
        return out
    for g in session.execute(select(Gpu.job_id, Gpu.node, Gpu.index)
                             .where(Gpu.job_id.in_(job_ids)).order_by(Gpu.node, Gpu.index)):
        out.setdefault(g.job_id, []).append({"node": g.node, "index": g.index})
    return out


def events(session: Session, job_id: str, after_seq: int = 0, limit: int = 1000) -> list:
    """A page of the job's events as rows (`id`, `at`, `kind`, `data`): columns, not ORM
    objects, since a page is up to 10,000 of them and nothing is written back
    (a 1000-event page of a job with 100K events)."""
    return list(session.execute(select(JobEvent.id, JobEvent.at, JobEvent.kind, JobEvent.data)
                                .where(JobEvent.job_id == job_id, JobEvent.id > after_seq)
                                .order_by(JobEvent.id).limit(limit)))


def metrics(session: Session, job_id: str) -> dict[str, list]:
    series: dict[str, list] = {}
    for ev in session.scalars(select(JobEvent).where(JobEvent.job_id == job_id,
                                                     JobEvent.kind == "metric")
                              .order_by(JobEvent.id)):
        step = ev.data.get("step")
        for k, v in ev.data.items():
            if k != "step" and isinstance(v, (int, float)):
                series.setdefault(k, []).append([step, v])
    return series


# ---- actions ----------------------------------------------------------------------------

def _may_act(user: Principal, job: Job) -> None:
    if not (user.is_admin or job.owner_id == user.id):
        raise Forbidden(f"only the owner of {job.id} or an admin may do this", code="not_owner")


def cancel_job(session: Session, user: Principal, job: Job, *, check_owner: bool = True) -> Job:
    if check_owner:
        _may_act(user, job)
    st = S(job.status)
    if st in (S.cancelling, S.cancelled):
        return job  # idempotent
    if st in (S.succeeded, S.failed):
        raise Conflict(f"job {job.id} already {st.value}; nothing to cancel",
                       code="job_finished", details={"status": st.value})
    if st == S.running:
        transition(session, job, S.cancelling, reason=f"cancelled by {user.name}")
    else:
        # pending/queued/dispatched: nothing runs yet; a dispatched task finds nothing to claim.
        transition(session, job, S.cancelled, reason=f"cancelled by {user.name}",
                   error={"code": "cancelled", "message": f"cancelled by {user.name}"})
    return job


def retry_job(session: Session, user: Principal, job: Job) -> Job:
    _may_act(user, job)
    if job.status not in (S.failed.value, S.cancelled.value):
        raise Conflict(f"job {job.id} is {job.status}; only failed or cancelled jobs can be "
                       "retried", code="not_retryable", details={"status": job.status})
    waiting = [d for d in job.depends_on
               if (dep := session.get(Job, d)) is None or dep.status != S.succeeded.value]
    transition(session, job, S.pending if waiting else S.queued, reason=f"retry by {user.name}",
               attempt=job.attempt + 1, error=None, finished_at=None, started_at=None,
               progress=None, node=None, queued_at=None, heartbeat_at=None)
    job.max_attempts = max(job.max_attempts, job.attempt + 1)
    queue_changed(session)  # back to pending: a pass re-checks its inputs
    return job


def _release_gpus(session: Session, job_id: str) -> None:
    """Called by `transition()`/`cas_status()` alone, as the job leaves an active state."""
    now = utcnow()
    session.execute(update(Gpu).where(Gpu.job_id == job_id).values(job_id=None))
    session.execute(update(GpuLease).where(GpuLease.job_id == job_id, GpuLease.end_at.is_(None))
                    .values(end_at=now))


def set_priority(session: Session, user: Principal, job: Job, priority: int) -> Job:
    if not user.is_admin:
        raise Forbidden("changing priority is an admin action", code="admin_only")
    job.priority = priority
    add_event(session, job.id, "status", {"priority": priority, "by": user.name})
    queue_changed(session)
    return job


def set_hold(session: Session, user: Principal, job: Job, held: bool) -> Job:
    _may_act(user, job)
    if job.status not in (S.pending.value, S.queued.value):
        raise Conflict(f"job {job.id} is {job.status}; only waiting jobs can be held or released",
                       code="not_waiting")
    job.held = held
    add_event(session, job.id, "status", {"held": held, "by": user.name})
    queue_changed(session)
    return job
