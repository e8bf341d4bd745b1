"""One scheduling decision at a time, under a DB lock: promote jobs whose inputs are ready,
reuse matching finished work, then lease GPUs (claimed with a conditional UPDATE, never
oversubscribed) and dispatch in policy order. Tasks are sent after commit."""

from __future__ import annotations

import functools
import gc
import json
import logging
import time
from collections.abc import Callable
from contextlib import contextmanager
from operator import itemgetter
from pathlib import Path
from typing import cast

from sqlalchemy import Integer, Table, bindparam, column, select, text, update
from sqlalchemy.orm import Session

from app.core.broker import send_run_job
from app.core.config import get_settings
from app.core.db import after_commit, is_sqlite, rowcount, unit_of_work, utcnow
from app.jobs.inputs import InputDeleted, Unresolved, fingerprint, resolve
from app.jobs.service import add_event, dispatched, transition
from app.jobs.states import JobStatus as S
from app.models import Artifact, Gpu, GpuLease, Job
from app.scheduler import preempt
from app.scheduler.policy import Usage, Waiting, fit_counts, plan
from app.storage import reserve
from app.scheduler.reads import (GPUS, HELD, ID, NEEDS_FP, OWNER, POS, PRIO, QAT, REASON,
                                 RESERVES_DISK, STATUS, UNSET, cpu_held, node_states,
                                 queued_in_order, recent_gpu_hours, waiting_rows)
from contracts.jobtypes import NEVER_REUSE

log = logging.getLogger("draftyard.scheduler")
# session.info flag of a scheduling pass: its own status changes need no further nudge.
SCHEDULING = "draftyard_scheduling"
LOCK_KEY = 7_100_427  # pg_advisory_xact_lock key of the scheduler
BROKER_PAUSE_S = 2.0  # after a refused send, this process dispatches nothing for a while
_broker_down_until = 0.0  # (monotonic) so an outage does not dispatch and roll back each tick
REASONS_TOP = 1000  # waiting jobs that get a queue_position and pending_reason


@contextmanager
def _gc_paused():
    """No cyclic GC while a decision builds its 10,000 small objects: a full collection
    triggered by them walks the whole process heap (tens of ms in the API process) and none
    of these objects form cycles. Re-enabled right after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def lock(session: Session) -> None:
    if is_sqlite(session):
        # BEGIN IMMEDIATE (app.core.db) already holds SQLite's single write lock.
        return
    session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK_KEY})


def try_lock(session: Session) -> bool:
    """The scheduler lock if it is free now (held until the transaction ends), else False."""
    if is_sqlite(session):
        return True
    return bool(session.scalar(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": LOCK_KEY}))


def _promote_pending(session: Session, pending: list[Job]) -> None:
    if not pending:
        return
    dep_ids = {d for j in pending for d in j.depends_on}
    # .all(): dict() of a Result would take it for a mapping (it has .keys()).
    states = dict(session.execute(select(Job.id, Job.status).where(Job.id.in_(dep_ids))).all()) \
        if dep_ids else {}
    for j in pending:
        waiting = [d for d in j.depends_on if states.get(d) != S.succeeded.value]
        if not waiting:
            transition(session, j, S.queued)
            continue
        bad = [d for d in waiting if states.get(d) in (S.failed.value, S.cancelled.value)]
        reason = (f"input job {bad[0]} {states[bad[0]]}; retry it to continue" if bad
                  else f"waiting for {', '.join(waiting)}")
        if j.pending_reason != reason:
            j.pending_reason = reason


def _reuse(session: Session, queued: list[Job]) -> None:
    """Give newly queued jobs a fingerprint; a match with a succeeded job reuses its outputs."""
    for j in queued:
        if j.fingerprint is not None or j.type in NEVER_REUSE:
            continue
        try:
            fp = fingerprint(j, resolve(session, j))
        except InputDeleted as e:  # waiting will not bring it back (app/storage/delete.py)
            transition(session, j, S.failed, error={"code": "input_deleted", "message": str(e)})
            continue
        except Unresolved as e:
            j.pending_reason = str(e)
            continue
        j.fingerprint = fp
        if j.force:
            continue
        prev = session.scalars(select(Job).where(Job.fingerprint == fp,
                                                 Job.status == S.succeeded.value,
                                                 Job.id != j.id).order_by(Job.finished_at.desc())
                               .limit(1)).first()
        if prev is None or not prev.outputs:
            continue
        arts = [session.get(Artifact, a) for a in prev.outputs]
        # A tombstone is never reused: the stage runs again and makes it anew.
        if any(a is None or a.deleted_at is not None or not Path(a.uri).exists() for a in arts):
            continue
        transition(session, j, S.succeeded, reason=f"reused outputs of {prev.id}",
                   outputs=list(prev.outputs), reused_from=prev.reused_from or prev.id,
                   metrics_summary=dict(prev.metrics_summary or {}),
                   progress={"stage": "reused", "done": 1, "total": 1, "unit": "job"})
        add_event(session, j.id, "log", {"message": f"reused the outputs of {prev.id}"})


def _promote_and_reuse(session: Session, ids: list[str]) -> bool:
    """Pending jobs whose inputs are ready become queued; new queued jobs get a fingerprint
    and may reuse finished work. Returns whether any job changed status."""
    todo = list(session.scalars(select(Job).where(Job.id.in_(ids))))
    before = {j.id: j.status for j in todo}
    pending = [j for j in todo if j.status == S.pending.value]
    _promote_pending(session, pending)
    fresh = [j for j in todo if j.status == S.queued.value and j.fingerprint is None
             and j.type not in NEVER_REUSE]
    if fresh:
        _reuse(session, fresh)
    session.flush()
    return any(j.status != before[j.id] for j in todo)


def schedule_once(session: Session, *, with_reasons: bool = True,
                  on_locked: Callable[[], None] | None = None, locked: bool = False) -> list[str]:
    """One decision. Returns the ids of jobs dispatched (their tasks go out after commit).

    `with_reasons`: also refresh `queue_position`/`pending_reason` of the first
    REASONS_TOP waiting jobs (only rows whose value changed are written).
    `on_locked`: called once the scheduler lock is held, before anything is read.
    `locked`: the caller holds the lock already (`try_lock`)."""
    session.info[SCHEDULING] = True
    if not locked:
        lock(session)
    if on_locked is not None:
        on_locked()
    now = utcnow()
    cfg = get_settings()
    nodes, cpu_free, held = node_states(session)
    # Placement only: read just the jobs that could start or hold a node back.
    most = max((len(nd.free) for nd in nodes if nd.schedulable), default=0)
    only = None if with_reasons else (most, cpu_free > 0,
                                      now.timestamp() - cfg.backfill_bound_s)
    held_for = preempt.held_for({nd.name: nd.holders for nd in nodes})
    few = None if with_reasons else (fit_counts(nodes), set(held_for.values()))
    with _gc_paused():
        rows = waiting_rows(session, with_reasons, only, few)
        pending = S.pending.value
        todo = [r[ID] for r in rows if r[NEEDS_FP] or r[STATUS] == pending]
        if todo and _promote_and_reuse(session, todo):
            rows = waiting_rows(session, with_reasons, only, few)  # some moved on: read again
        rows = queued_in_order(rows)
        if not rows:
            return []
        now_ts = now.timestamp()
        waiting = [Waiting(r[ID], r[OWNER], r[PRIO], r[GPUS],
                           now_ts if r[QAT] == UNSET else r[QAT], r[HELD]) for r in rows]
        hours = recent_gpu_hours(session, now)
        # One more statement, only when a CPU job waits (most decisions place GPU jobs).
        cpu = cpu_held(session) if 0 in map(itemgetter(GPUS), rows) else {}
        usage = {o: Usage(held.get(o, 0), hours.get(o, 0.0), cpu.get(o, 0))
                 for o in set(held) | set(hours) | set(cpu)}
        p = plan(waiting, nodes, usage, now=now_ts, quota=cfg.user_gpu_quota,
                 backfill_bound_s=cfg.backfill_bound_s, cpu_free=cpu_free,
                 user_cpu_slots=cfg.user_cpu_slots,
                 top=REASONS_TOP if with_reasons else 0, presorted=True,
                 held_for=held_for)
    by_id = {r[ID]: r for r in rows}
    # Lease start after the GPU rows were read: a GPU freed by a commit that this pass saw
    # was released before this instant, so the lease history never shows a false overlap.
    now = utcnow()
    sent: list[tuple[str, str]] = []
    moved: list[Job] = []
    todo = p.dispatch if time.monotonic() >= _broker_down_until else []
    disk = _disk_check(session, [t for t in todo if by_id[t[0]][RESERVES_DISK]], p.reasons)
    for job_id, node, idx in todo:
        if job_id in disk:
            continue  # its disk reservation does not fit: it waits, with the reason
        if (job := _dispatch(session, job_id, by_id[job_id][OWNER], node, idx, now)):
            moved.append(job)
            sent.append((job_id, f"gpu.{node}" if idx else "cpu"))
    dispatched(session, moved)  # announced like every other change
    if p.gpu_waits:
        _preempt(session, p, by_id, nodes, now, cfg.preempt_max_per_hour)
    if with_reasons:
        _write_reasons(session, p, rows, {j for j, _, _ in p.dispatch if j not in disk})
    if sent:
        after_commit(session, functools.partial(_send, sent))
    return [j for j, _ in sent]


def _disk_check(session: Session, todo: list, reasons: dict[str, str]) -> set[str]:
    """Reserve the disk of the jobs about to be placed (app/storage/reserve.py), in order;
    returns the ones whose reservation does not fit, each with its reason. `todo`: only
    the placements of types that reserve (most decisions have none: no statement then)."""
    if not todo:
        return set()
    jobs = {j.id: j for j in session.scalars(select(Job).where(
        Job.id.in_([t[0] for t in todo]), Job.type.in_(reserve.RESERVES)))}
    if not jobs:
        return set()
    disk, refused = reserve.Disk(session), set()
    for job_id, _node, _idx in todo:
        if job_id in jobs and (why := disk.place(jobs[job_id])):
            refused.add(job_id)
            reasons[job_id] = why
    return refused


def _preempt(session: Session, p, by_id, nodes, now, max_per_hour: int) -> None:
    """Ask lower-priority preemptible jobs to yield to jobs that wait for GPUs: mark them
    (`preempt_by`); their supervisors SIGTERM the stage, which checkpoints and exits, and
    workers/runner.py requeues them. Their GPUs go to the waiting job on a later pass.
    `by_id`: the pass's queued rows by job id."""
    waiters = [(j, by_id[j][PRIO], by_id[j][GPUS]) for j in p.gpu_waits if j in by_id]
    taken: dict[str, set[int]] = {}
    for _j, node, idx in p.dispatch:
        if node:
            taken.setdefault(node, set()).update(idx)
    live = [nd for nd in nodes if nd.schedulable]
    free = {nd.name: len(set(nd.free) - taken.get(nd.name, set())) for nd in live}
    chosen = preempt.choose(waiters, free, {nd.name: nd.total for nd in live},
                            {nd.name: nd.holders for nd in live}, now=now.timestamp(),
                            max_per_hour=max_per_hour, reserved=p.reserved)
    for c in chosen:
        for victim in c.victims:
            # Still running and not yet asked: a job that ended since the read keeps its end.
            res = session.execute(update(Job).where(Job.id == victim,
                                                    Job.status == S.running.value,
                                                    Job.preempt_by.is_(None))
                                  .values(preempt_by=c.waiter))
            if rowcount(res) == 1:
                add_event(session, victim, "log", {
                    "message": f"preempting: {c.waiter} (priority {c.waiter_priority}) needs "
                               f"the GPUs on {c.node}; checkpointing, then requeued"})
                log.info("preempting %s on %s for %s", victim, c.node, c.waiter)
def _send(sent: list[tuple[str, str]]) -> None:
    """Send the committed dispatches. One the broker refused (down) goes back to `queued`
    with its GPUs freed at once, instead of holding them in `dispatched` until the
    reaper's stale rule; the next pass dispatches it again."""
    failed = []
    for job_id, queue in sent:
        try:
            send_run_job(job_id, queue)
        except Exception as e:  # noqa: BLE001  broker down: roll this dispatch back
            log.warning("dispatch of %s to %s not sent (%s); back to queued", job_id, queue, e)
            failed.append(job_id)
    if failed:
        global _broker_down_until
        _broker_down_until = time.monotonic() + BROKER_PAUSE_S
        undispatch(failed, "broker unreachable; dispatch rolled back")


def undispatch(job_ids: list[str], reason: str) -> None:
    """dispatched -> queued with GPUs freed, for jobs no worker has claimed (a worker that
    got the message anyway finds nothing to claim)."""
    with unit_of_work() as s:
        for job in s.scalars(select(Job).where(Job.id.in_(job_ids),
                                               Job.status == S.dispatched.value)
                             .with_for_update()):
            transition(s, job, S.queued, reason=reason, node=None, pending_reason=reason)


# The job (still queued, not held: it may have been cancelled or held since it was read),
# then its GPUs (still free: never oversubscribe), the lease history and the status event,
# in one statement. Returns the job's row as it now is, with the GPUs claimed (no row: the
# job was not moved), so announcing the change reads nothing more. Announced by
# app.jobs.service.dispatched once the pass has placed every job.
_DISPATCH_PG = text("""
WITH j AS (UPDATE jobs SET status = :to, node = :node, pending_reason = NULL,
                           heartbeat_at = :now, queue_position = NULL
           WHERE id = :id AND status = :from AND NOT held RETURNING *),
g AS (UPDATE gpus SET job_id = :id
      WHERE node = :node AND "index" = ANY(CAST(:idx AS integer[])) AND job_id IS NULL
        AND EXISTS (SELECT 1 FROM j) RETURNING "index"),
l AS (INSERT INTO gpu_leases (job_id, owner_id, node, "index", start_at)
      SELECT :id, :owner, :node, g."index", :now FROM g),
e AS (INSERT INTO job_events (job_id, at, kind, data)
      SELECT :id, :now, 'status', CAST(:data AS json) FROM j)
SELECT """ + ", ".join(f'j."{c.name}"' for c in cast(Table, Job.__table__).c) + """,
       (SELECT count(*) FROM g) AS claimed FROM j""").columns(
    *cast(Table, Job.__table__).c, column("claimed", Integer))
_DISPATCHED_JOB = select(Job, column("claimed", Integer)).from_statement(_DISPATCH_PG) \
    .execution_options(populate_existing=True)


def _dispatch(session: Session, job_id: str, owner: str, node: str | None, idx: list[int],
              now) -> Job | None:
    """queued -> dispatched with its GPUs leased: the job as it now is, or None if it is no
    longer queued."""
    event = {"from": S.queued.value, "to": S.dispatched.value, "node": node, "gpus": idx}
    if not is_sqlite(session):
        row = session.execute(_DISPATCHED_JOB, {
            "from": S.queued.value, "to": S.dispatched.value, "id": job_id, "owner": owner,
            "node": node, "idx": idx, "now": now, "data": json.dumps(event)}).first()
        if row is not None and row.claimed != len(idx):  # someone else holds one
            raise RuntimeError(f"lease conflict on {node} {idx}")  # never oversubscribe
        return None if row is None else row[0]
    res = session.execute(update(Job).where(Job.id == job_id, Job.status == S.queued.value,
                                            Job.held.is_(False))
                          .values(status=S.dispatched.value, node=node, pending_reason=None,
                                  heartbeat_at=now, queue_position=None))
    if rowcount(res) != 1:
        return None
    if idx:
        res = session.execute(update(Gpu).where(Gpu.node == node, Gpu.index.in_(idx),
                                                Gpu.job_id.is_(None)).values(job_id=job_id))
        if rowcount(res) != len(idx):
            raise RuntimeError(f"lease conflict on {node} {idx}")
        session.add_all([GpuLease(job_id=job_id, owner_id=owner, node=node, index=i,
                                  start_at=now) for i in idx])
    add_event(session, job_id, "status", event)
    return session.get(Job, job_id)


def _write_reasons(session: Session, p, rows, dispatched: set[str]) -> None:
    """queue_position and pending_reason for the first REASONS_TOP waiting jobs (others get
    none), written in one statement and only where they changed."""
    want: dict[str, tuple[int | None, str | None]] = {}
    pos = 0
    for jid in p.order:
        if jid in dispatched:
            continue
        pos += 1
        if pos > REASONS_TOP:
            break
        want[jid] = (pos, p.reasons.get(jid))
    changes = [(r[ID], w[0], w[1]) for r in rows
               if r[ID] not in dispatched
               and (w := want.get(r[ID], (None, None))) != (r[POS], r[REASON])]
    if not changes:
        return
    if is_sqlite(session):
        t = cast(Table, Job.__table__)
        session.execute(update(t).where(t.c.id == bindparam("b_id"),
                                        t.c.status == S.queued.value)
                        .values(queue_position=bindparam("b_pos"),
                                pending_reason=bindparam("b_reason")),
                        [{"b_id": i, "b_pos": p_, "b_reason": r} for i, p_, r in changes])
        return
    # One statement for all of them (a row-by-row executemany costs a round trip each).
    ids, pos_, why = zip(*changes)
    session.execute(text(
        "UPDATE jobs AS j SET queue_position = v.pos, pending_reason = v.reason "
        "FROM unnest(CAST(:ids AS varchar[]), CAST(:pos AS integer[]), "
        "CAST(:why AS varchar[])) AS v(id, pos, reason) "
        "WHERE j.id = v.id AND j.status = :queued"),
        {"queued": S.queued.value, "ids": list(ids), "pos": list(pos_), "why": list(why)})
