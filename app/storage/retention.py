"""Retention: what draftyard removes by itself, and when.

What outlives what:
- A published artifact lives until someone deletes it (app/storage/delete.py), except an
  offline run's hidden states: once the run's train stage has succeeded and no live job needs
  them (its evaluate does not read them), they become a tombstone (deleted_by "retention"),
  unless kept (`keep: true` on the run or the extract job, or DRAFTYARD_KEEP_HIDDEN_STATES).
- A job's scratch (`jobs/<id>/work/`: checkpoints, finished shards, partial samples) outlives
  every attempt of the job while it can still be resumed: it goes when the job succeeds (its
  outputs are published by then), and DRAFTYARD_SCRATCH_TTL_S after a job that ended failed
  or cancelled, counted from its end. A retry (or a requeue after preemption or a lost
  worker) makes the job live again, and a live job's scratch is never removed, so a retry
  within the TTL resumes from its shards; after it, the retry starts over. `keep` keeps it.
- The job's log and events stay with the job row (`jobs/<id>/log.txt`).

`plan()` lists what would go now (`draftyard storage prune --dry-run`, and the reclaimable
bytes of GET /v1/storage); `prune()` removes it. Hidden states are also removed as soon as
their run allows (`on_job_status`), and a succeeded job's scratch by the worker that ran it
(`settle_scratch`)."""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.config import get_settings
from app.core.db import after_commit, unit_of_work, utcnow
from app.jobs.lifecycle import StatusChanged
from app.jobs.states import TERMINAL
from app.models import Artifact, Job, Run
from app.storage.delete import RETENTION, needed_by, tombstone


@dataclass(frozen=True)
class Item:
    what: str        # "hidden_states" (an artifact) or "scratch" (a job's work/ folder)
    id: str          # the artifact id, or the job id
    bytes: int
    owner: str | None
    run_id: str | None
    reason: str

    def as_dict(self) -> dict:
        return asdict(self)


def work_dir(job_id: str) -> Path:
    return get_settings().jobs_dir / job_id / "work"


def tree_bytes(path: Path) -> int:
    """Bytes under a folder (measured once, when a job ends: never on a read)."""
    total = 0
    if path.is_dir():
        for p in path.rglob("*"):
            try:
                if p.is_file() and not p.is_symlink():
                    total += p.stat().st_size
            except OSError:
                continue
    return total


def _kept(job: Job | None) -> bool:
    if job is None or job.keep is None:
        return get_settings().keep_hidden_states
    return bool(job.keep)


def _hidden_states(session: Session, run_ids: list[str] | None = None) -> list[Item]:
    """Live hidden-state artifacts of runs whose train succeeded and that no live job needs."""
    stmt = (select(Artifact, Job).join(Job, Job.id == Artifact.producer_job)
            .where(Artifact.kind == "hidden_states", Artifact.deleted_at.is_(None),
                   Job.run_id.is_not(None)))
    if run_ids is not None:
        stmt = stmt.where(Job.run_id.in_(run_ids))
    rows = session.execute(stmt).all()
    if not rows:
        return []
    runs = {r for _, j in rows for r in [j.run_id]}
    trained = set(session.scalars(select(Job.run_id).where(
        Job.run_id.in_(runs), Job.type == "train", Job.status == "succeeded")))
    out = []
    for art, job in rows:
        if job.run_id not in trained or _kept(job):
            continue
        if needed_by(session, [art.id]):
            continue
        out.append(Item("hidden_states", art.id, art.bytes, art.owner_id, job.run_id,
                        f"run {job.run_id}: train succeeded; nothing live needs them"))
    return out


def _scratch(session: Session, now) -> list[Item]:
    ttl = timedelta(seconds=get_settings().scratch_ttl_s)
    rows = session.scalars(select(Job).where(Job.status.in_(TERMINAL),
                                             Job.scratch_removed_at.is_(None),
                                             Job.finished_at.is_not(None)))
    out = []
    for j in rows:
        if j.keep or j.finished_at is None:
            continue
        if j.status != "succeeded" and j.finished_at > now - ttl:
            continue  # a retry within the TTL resumes from these
        if not work_dir(j.id).exists():
            continue
        why = ("succeeded" if j.status == "succeeded"
               else f"{j.status} at {j.finished_at.isoformat()}, past the scratch TTL")
        out.append(Item("scratch", j.id, j.scratch_bytes or 0, j.owner_id, j.run_id,
                        f"job {j.id} {why}"))
    return out


def plan(session: Session) -> list[Item]:
    return _hidden_states(session) + _scratch(session, utcnow())


def remove_scratch(session: Session, job: Job) -> int:
    """Remove a job's work/ once this transaction commits; record it. Returns its bytes."""
    size = job.scratch_bytes if job.scratch_bytes is not None else tree_bytes(work_dir(job.id))
    job.scratch_bytes = size
    job.scratch_removed_at = utcnow()
    folder = work_dir(job.id)
    after_commit(session, lambda: shutil.rmtree(folder, ignore_errors=True))
    return size


def prune(session: Session, items: list[Item]) -> int:
    freed = 0
    for it in items:
        if it.what == "hidden_states":
            art = session.get(Artifact, it.id)
            if art is not None and art.deleted_at is None:
                tombstone(session, art, RETENTION)
                freed += art.bytes
        else:
            job = session.get(Job, it.id)
            if job is not None and job.scratch_removed_at is None:
                freed += remove_scratch(session, job)
    return freed


def on_job_status(session: Session, ev: StatusChanged) -> None:
    """Subscriber (app/wiring.py): when a run's job ends, its hidden states go if the run
    allows (train succeeded, nothing live needs them, not kept); same transaction, files
    after the commit (app/storage/delete.py's order)."""
    if ev.new not in TERMINAL or not ev.job.run_id:
        return
    if session.get(Run, ev.job.run_id) is None:
        return
    session.flush()
    for it in _hidden_states(session, [ev.job.run_id]):
        art = session.get(Artifact, it.id)
        if art is not None:
            tombstone(session, art, RETENTION)


def settle_scratch(job_id: str) -> None:
    """Called by the worker once an attempt is recorded: a succeeded job's scratch goes now
    (unless kept); otherwise its size is measured once for the usage report."""
    with unit_of_work() as s:
        job = s.get(Job, job_id)
        if job is None or job.status not in TERMINAL or job.scratch_removed_at is not None:
            return
        if job.status == "succeeded" and not job.keep:
            remove_scratch(s, job)
        else:
            job.scratch_bytes = tree_bytes(work_dir(job_id))
