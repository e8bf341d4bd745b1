"""One scheduling decision at a time, under a DB lock: promote jobs whose inputs are ready,
reuse matching finished work, then lease GPUs (claimed with a conditional UPDATE, never
oversubscribed) and dispatch in policy order. Tasks are sent after commit."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from pathlib import Path

from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

from app.core.broker import send_run_job
from app.core.config import get_settings
from app.core.db import after_commit, is_sqlite, utcnow
from app.jobs import catalog
from app.jobs.inputs import Unresolved, fingerprint, resolve
from app.jobs.service import add_event, transition
from app.jobs.states import JobStatus as S
from app.models import Artifact, Gpu, GpuLease, Job, Node
from app.scheduler.policy import NodeState, Usage, Waiting, plan

log = logging.getLogger("draftyard.scheduler")
LOCK_KEY = 7_100_427  # pg_advisory_xact_lock key of the scheduler


def lock(session: Session) -> None:
    if is_sqlite(session):
        # BEGIN IMMEDIATE (app.core.db) already holds SQLite's single write lock.
        return
    session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK_KEY})


def _promote_pending(session: Session) -> None:
    pending = list(session.scalars(select(Job).where(Job.status == S.pending.value)))
    if not pending:
        return
    dep_ids = {d for j in pending for d in j.depends_on}
    states = dict(session.execute(select(Job.id, Job.status).where(Job.id.in_(dep_ids)))) if dep_ids else {}
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
        if j.fingerprint is not None or j.type in catalog.NEVER_REUSE:
            continue
        try:
            fp = fingerprint(j, resolve(session, j))
        except Unresolved as e:
            j.pending_reason = str(e)
            continue
        j.fingerprint = fp
        if j.force:
            continue
        prev = session.scalars(select(Job).where(Job.fingerprint == fp, Job.status == "succeeded",
                                                 Job.id != j.id).order_by(Job.finished_at.desc())
                               .limit(1)).first()
        if prev is None or not prev.outputs:
            continue
        arts = [session.get(Artifact, a) for a in prev.outputs]
        if any(a is None or not Path(a.uri).exists() for a in arts):
            continue
        transition(session, j, S.succeeded, reason=f"reused outputs of {prev.id}",
                   outputs=list(prev.outputs), reused_from=prev.reused_from or prev.id,
                   metrics_summary=dict(prev.metrics_summary or {}),
                   progress={"stage": "reused", "done": 1, "total": 1, "unit": "job"})
        add_event(session, j.id, "log", {"message": f"reused the outputs of {prev.id}"})


def usage_by_owner(session: Session, now) -> dict[str, Usage]:
    usage: dict[str, Usage] = {}
    for owner, n in session.execute(select(GpuLease.owner_id, func.count())
                                    .where(GpuLease.end_at.is_(None)).group_by(GpuLease.owner_id)):
        usage.setdefault(owner, Usage()).gpus_held = int(n)
    since = now - timedelta(hours=24)
    for owner, start, end in session.execute(select(GpuLease.owner_id, GpuLease.start_at,
                                                    GpuLease.end_at)
                                             .where((GpuLease.end_at.is_(None)) |
                                                    (GpuLease.end_at > since))):
        start = start if start.tzinfo else start.replace(tzinfo=now.tzinfo)
        end = (end if end is None or end.tzinfo else end.replace(tzinfo=now.tzinfo)) or now
        usage.setdefault(owner, Usage()).gpu_hours += max(0.0, (end - max(start, since)).total_seconds()) / 3600
    return usage


def node_states(session: Session) -> tuple[list[NodeState], int]:
    s = get_settings()
    cutoff = utcnow() - timedelta(seconds=s.stale_after_s)
    nodes = {n.name: n for n in session.scalars(select(Node))}
    states: dict[str, NodeState] = {}
    cpu_total = 0
    for name, n in nodes.items():
        hb = n.last_heartbeat if n.last_heartbeat.tzinfo else n.last_heartbeat.replace(tzinfo=cutoff.tzinfo)
        ok = n.alive and hb >= cutoff and not n.draining
        states[name] = NodeState(name=name, free=[], total=0, schedulable=ok)
        if ok:
            cpu_total += n.cpu_slots
    for g in session.scalars(select(Gpu)):
        st = states.get(g.node)
        if st is None:
            continue
        st.total += 1
        if g.job_id is None:
            st.free.append(g.index)
    cpu_busy = session.scalar(select(func.count()).select_from(Job).where(
        Job.gpus_requested == 0, Job.status.in_(("dispatched", "running", "cancelling")))) or 0
    return list(states.values()), max(0, cpu_total - cpu_busy)


def schedule_once(session: Session, *, with_reasons: bool = True) -> list[str]:
    """One decision. Returns the ids of jobs dispatched (their tasks go out after commit)."""
    lock(session)
    _promote_pending(session)
    session.flush()
    queued = list(session.scalars(select(Job).where(Job.status == S.queued.value,
                                                    Job.fingerprint.is_(None))))
    if queued:
        _reuse(session, queued)
        session.flush()
    now = utcnow()
    rows = session.execute(select(Job.id, Job.owner_id, Job.priority, Job.gpus_requested,
                                  Job.queued_at, Job.held).where(Job.status == S.queued.value)).all()
    if not rows:
        return []
    waiting = [Waiting(r.id, r.owner_id, r.priority, r.gpus_requested,
                       (r.queued_at or now).timestamp(), r.held) for r in rows]
    nodes, cpu_free = node_states(session)
    s = get_settings()
    p = plan(waiting, nodes, usage_by_owner(session, now), now=time.time(), quota=s.user_gpu_quota,
             backfill_bound_s=s.backfill_bound_s, cpu_free=cpu_free)
    sent: list[tuple[str, str]] = []
    owners = {r.id: r.owner_id for r in rows}
    for job_id, node, idx in p.dispatch:
        if idx:
            res = session.execute(update(Gpu).where(Gpu.node == node, Gpu.index.in_(idx),
                                                    Gpu.job_id.is_(None)).values(job_id=job_id))
            if res.rowcount != len(idx):  # someone else holds one: never oversubscribe
                raise RuntimeError(f"lease conflict on {node} {idx}")
            for i in idx:
                session.add(GpuLease(job_id=job_id, owner_id=owners[job_id], node=node, index=i,
                                     start_at=now))
        res = session.execute(update(Job).where(Job.id == job_id, Job.status == S.queued.value)
                              .values(status=S.dispatched.value, node=node, pending_reason=None, heartbeat_at=now,
                                      queue_position=None))
        if res.rowcount == 1:
            add_event(session, job_id, "status", {"from": "queued", "to": "dispatched",
                                                  "node": node, "gpus": idx})
            sent.append((job_id, f"gpu.{node}" if idx else "cpu"))
    if with_reasons:
        _write_reasons(session, p, set(j for j, _, _ in p.dispatch))
    if sent:
        def _send(sent=sent):
            for job_id, queue in sent:
                send_run_job(job_id, queue)
        after_commit(session, _send)
    return [j for j, _ in sent]


def _write_reasons(session: Session, p, dispatched: set[str], top: int = 1000) -> None:
    """queue_position and pending_reason for the first `top` waiting jobs, only where changed."""
    pos = 0
    rows = {r.id: (r.queue_position, r.pending_reason) for r in session.execute(
        select(Job.id, Job.queue_position, Job.pending_reason).where(Job.status == "queued"))}
    for jid in p.order:
        if jid in dispatched:
            continue
        pos += 1
        if pos > top:
            break
        reason = p.reasons.get(jid)
        if rows.get(jid) != (pos, reason):
            session.execute(update(Job).where(Job.id == jid)
                            .values(queue_position=pos, pending_reason=reason))
