"""What a scheduling decision reads, in as few statements as possible: a decision runs inside
a submit request and after every job's end, and on a busy box each statement is a wake-up of
the database process, not just its execution time."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from operator import itemgetter
from typing import cast

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from app.core.config import get_settings
from app.core.db import db_now, is_sqlite
from app.jobs.states import LEASED
from app.jobs.states import JobStatus as S
from app.models import Gpu, GpuLease, Job, Node
from app.scheduler.policy import NodeState, Usage
from app.scheduler.preempt import Holder
from app.storage.reserve import RESERVES
from contracts.jobtypes import JOB_TYPES, NEVER_REUSE

USAGE_WINDOW_H = 24  # "recent GPU-hours" of fair share
HOURS_TTL_S = 2.0  # how stale a decision may read the GPU-hours (they move by seconds)

# Waiting jobs (pending and queued), unsorted: `queued_in_order` sorts the queued ones in
# Python, several times cheaper than the database's sort of the same rows (measured on the
# 10,000-job bench, bench/scheduler.py). `needs_fp`: queued, not fingerprinted yet, reusable
# type. `reserves`: its type reserves disk when placed (app/storage/reserve.py). A queued_at
# that is unset reads as +inf (last in its priority, as the database sorted NULLs).
_NEVER = ", ".join(f"'{t}'" for t in sorted(NEVER_REUSE)) or "''"
_NEEDS_FP = f"(fingerprint IS NULL AND type NOT IN ({_NEVER}))"
_RESERVES = "type IN (" + ", ".join(f"'{t}'" for t in sorted(RESERVES)) + ")"
_ROWS_SQL = ("SELECT id, owner_id, priority, gpus_requested, coalesce({epoch}, {inf}), held, "
             "status, " + _NEEDS_FP + ", " + _RESERVES + "{extra} FROM jobs "
             f"WHERE status IN ('{S.pending}', '{S.queued}')" + "{only}")
_EPOCH = {"postgresql": "date_part('epoch', queued_at)",  # float8: no numeric arithmetic
          "sqlite": "(julianday(queued_at) - 2440587.5) * 86400.0"}
_INF = {"postgresql": "'Infinity'::float8", "sqlite": "9e999"}
UNSET = float("inf")  # the queued_at of a row that has none
# Only the jobs a placement-only decision needs (see `waiting_rows`). The numbers are bound
# parameters: one statement text, which the driver prepares once per connection (parsing
# and planning it again each decision cost a fifth of a millisecond or more).
_ONLY = (f" AND (status = '{S.pending}' OR " + _NEEDS_FP + " OR (NOT held AND ("
         "(gpus_requested = 0 AND :cpu) OR gpus_requested BETWEEN 1 AND :most OR "
         "(gpus_requested > 0 AND {epoch} < :aged))))")
ID, OWNER, PRIO, GPUS, QAT, HELD, STATUS, NEEDS_FP, RESERVES_DISK, POS, REASON = range(11)

# The same jobs on PostgreSQL, read through the partial indexes of migration
# s40_queue_indexes (a few hundred index entries instead of a scan of every waiting row):
# the pending ones, the queued ones to fingerprint, and of the queued ones not held: the CPU
# jobs (when a slot is free), the aged GPU jobs, the jobs a preemption frees a node for
# (`keep`), and each owner's first `fit_counts[g]` g-GPU jobs (`policy.few_that_matter`: the
# others cannot start in this decision). The owners come from a skip scan of the index.
# Each predicate repeats its index's own, so that the planner can use the index.
_COLS = ("j.id, j.owner_id, j.priority, j.gpus_requested, "
         "coalesce(date_part('epoch', j.queued_at), 'Infinity'::float8), j.held, j.status, "
         f"(j.fingerprint IS NULL AND j.type NOT IN ({_NEVER})), "
         "j.type IN (" + ", ".join(f"'{t}'" for t in sorted(RESERVES)) + ")")
_REUSABLE = ", ".join(f"'{t}'" for t in sorted(set(JOB_TYPES) - NEVER_REUSE)) or "''"
_QUEUE = f"j.status = '{S.queued}' AND NOT j.held"
_FEW_PG = text(f"""
WITH RECURSIVE o(owner) AS (
  (SELECT j.owner_id FROM jobs j WHERE {_QUEUE} ORDER BY j.owner_id LIMIT 1)
  UNION ALL
  SELECT (SELECT j.owner_id FROM jobs j WHERE {_QUEUE} AND j.owner_id > o.owner
          ORDER BY j.owner_id LIMIT 1) FROM o WHERE o.owner IS NOT NULL)
SELECT {_COLS} FROM jobs j WHERE j.status = '{S.pending}'
UNION SELECT {_COLS} FROM jobs j
  WHERE j.status = '{S.queued}' AND j.fingerprint IS NULL AND j.type IN ({_REUSABLE})
UNION SELECT {_COLS} FROM jobs j WHERE {_QUEUE} AND j.gpus_requested = 0 AND :cpu
UNION SELECT {_COLS} FROM jobs j
  WHERE {_QUEUE} AND j.gpus_requested > 0 AND j.queued_at < :aged
UNION SELECT {_COLS} FROM jobs j WHERE {_QUEUE} AND j.id = ANY(CAST(:keep AS varchar[]))
UNION SELECT {_COLS} FROM o CROSS JOIN generate_series(1, :most) AS g(n)
  CROSS JOIN LATERAL (
    SELECT * FROM jobs j WHERE {_QUEUE} AND j.owner_id = o.owner AND j.gpus_requested = g.n
    ORDER BY j.priority DESC, j.queued_at, j.id COLLATE "C"
    LIMIT (CAST(:caps AS integer[]))[g.n]) j
  WHERE o.owner IS NOT NULL""")
_AGE, _PRIO = itemgetter(QAT, ID), itemgetter(PRIO)


@lru_cache
def _rows_sql(dialect: str, with_reasons: bool, only: bool):
    return text(_ROWS_SQL.format(
        epoch=_EPOCH[dialect], inf=_INF[dialect],
        only=_ONLY.format(epoch=_EPOCH[dialect]) if only else "",
        extra=", queue_position, pending_reason" if with_reasons else ""))


def waiting_rows(session: Session, with_reasons: bool,
                 only: tuple[int, bool, float] | None = None,
                 few: tuple[list[int], set[str]] | None = None) -> list[tuple]:
    """(id, owner, priority, gpus, queued_at epoch s, held, status, needs_fp, reserves[,
    position, reason]) of the pending and queued jobs, in no order (`queued_in_order`).
    Plain driver rows: with 10,000 queued, ORM rows or datetime objects would each cost more
    than the rest of the decision.

    `only=(most_free_gpus, cpu_slot_free, aged_before_epoch)` leaves out the queued jobs
    that cannot change this decision: held ones, and those that fit nowhere now (GPUs only
    get fewer during a decision) unless they waited past the aging bound (they may hold a
    node back). The jobs left out would only have been given a reason, so the placements
    are the same as from all of them (tests/scheduler/test_policy.py checks that).

    `few=(policy.fit_counts(nodes), keep)` with `only`, on PostgreSQL: fewer still, the jobs
    `policy.few_that_matter` keeps (the same placements again; `_FEW_PG`)."""
    dialect = "sqlite" if is_sqlite(session) else "postgresql"
    if few is not None and only is not None and dialect == "postgresql" and not with_reasons:
        return cast(list[tuple], session.connection().execute(_FEW_PG, {
            # caps[g] is the SQL array's element g: it counts from 1
            "most": len(few[0]) - 1, "caps": list(few[0][1:]), "keep": sorted(few[1]),
            "cpu": bool(only[1]),
            "aged": datetime.fromtimestamp(float(only[2]), timezone.utc)}).all())
    sql = _rows_sql(dialect, with_reasons, only is not None)
    params = {} if only is None else {"most": int(only[0]), "cpu": bool(only[1]),
                                      "aged": float(only[2])}
    return cast(list[tuple], session.connection().execute(sql, params).all())


def queued_in_order(rows: list[tuple]) -> list[tuple]:
    """The queued rows of `waiting_rows` in `policy.job_order`: highest priority first, then
    oldest, then by id (two stable sorts: cheaper than one on a built key)."""
    queued = S.queued.value
    q = [r for r in rows if r[STATUS] == queued]
    q.sort(key=_AGE)
    q.sort(key=_PRIO, reverse=True)  # reverse keeps each priority's age order
    return q


def node_states(session: Session) -> tuple[list[NodeState], int, dict[str, int]]:
    """Nodes (schedulable = alive, heartbeat fresh, not draining) with their free GPUs, the
    free CPU slots, and the GPUs each owner holds now: one statement. Each node's `holders`
    are the jobs on its GPUs, with what preemption needs to know of them."""
    cutoff = db_now(session) - timedelta(seconds=get_settings().stale_after_s)
    cpu_busy = select(func.count()).select_from(Job).where(
        Job.gpus_requested == 0, Job.status.in_(LEASED)).scalar_subquery()
    states: dict[str, NodeState] = {}
    held: dict[str, int] = {}
    by_job: dict[str, Holder] = {}
    cpu_total, busy = 0, 0
    for r in session.execute(
            select(Node.name, Node.alive, Node.draining, Node.last_heartbeat, Node.cpu_slots,
                   Gpu.index, Gpu.job_id, Job.owner_id, cpu_busy, Job.priority, Job.status,
                   Job.preemptible, Job.preempt_by, Job.preemption, Job.started_at)
            .select_from(Node).outerjoin(Gpu, Gpu.node == Node.name)
            .outerjoin(Job, Job.id == Gpu.job_id)):
        busy = r[8] or 0
        st = states.get(r.name)
        if st is None:
            ok = bool(r.alive and r.last_heartbeat >= cutoff and not r.draining)
            st = states[r.name] = NodeState(name=r.name, free=[], total=0, schedulable=ok)
            cpu_total += r.cpu_slots if ok else 0
        if r.index is None:
            continue
        st.total += 1
        if r.job_id is None:
            st.free.append(r.index)
        elif r.owner_id is not None:
            held[r.owner_id] = held.get(r.owner_id, 0) + 1
            h = by_job.get(r.job_id)
            if h is None:
                h = by_job[r.job_id] = Holder(
                    r.job_id, r.priority, [], bool(r.preemptible), r.status == S.running,
                    r.preempt_by, list((r.preemption or {}).get("history") or []),
                    r.started_at.timestamp() if r.started_at else 0.0)
                st.holders.append(h)
            h.gpus.append(r.index)
    if not states:
        busy = session.scalar(select(cpu_busy)) or 0
    return list(states.values()), max(0, cpu_total - busy), held


def largest_gpu_node(session: Session) -> int:
    """GPUs of the largest schedulable node (0: no node could run a GPU job now). Nodes and
    leases only: a job being created in this session need not be flushed for it."""
    with session.no_autoflush:
        return max((n.total for n in node_states(session)[0] if n.schedulable), default=0)


_fits_lock = threading.Lock()
_fits: dict[str, tuple[float, int]] = {}  # database -> (read at, GPUs of its largest node)


def no_gpu_node_reason(session: Session, gpus: int) -> str | None:
    """Why a job asking for `gpus` cannot start on this deployment as it is (None: it can).
    Asked at every GPU job's submit: a node big enough seen less than HOURS_TTL_S ago in
    this process answers without reading the nodes again (the submit's own decision reads
    them right after); a too-small answer is never reused, so a job no node fits is always
    told so at once."""
    if gpus <= 0:
        return None
    key, t = str(session.get_bind().engine.url), time.monotonic()
    with _fits_lock:
        hit = _fits.get(key)
    if hit is not None and t - hit[0] < HOURS_TTL_S and hit[1] >= gpus:
        return None
    top = largest_gpu_node(session)
    with _fits_lock:
        _fits[key] = (t, top)
    if top >= gpus:
        return None
    return (f"needs {gpus} GPU(s) on one node; the largest schedulable node has {top}"
            if top else "no schedulable node with GPUs is registered") + \
        ": it waits until a worker with enough GPUs joins (draftyard worker --gpus ...)"


def usage_by_owner(session: Session, now: datetime) -> dict[str, Usage]:
    """GPUs held now and GPU-hours over the last USAGE_WINDOW_H, per owner, from the lease
    history (the queue view; a decision takes GPUs held from `node_states`)."""
    since = now - timedelta(hours=USAGE_WINDOW_H)
    recent = (GpuLease.end_at.is_(None)) | (GpuLease.end_at > since)
    usage: dict[str, Usage] = {}
    if not is_sqlite(session):
        secs = func.extract("epoch", func.coalesce(GpuLease.end_at, now)
                            - func.greatest(GpuLease.start_at, since))
        for owner, n_open, total in session.execute(
                select(GpuLease.owner_id, func.count().filter(GpuLease.end_at.is_(None)),
                       func.sum(secs)).where(recent).group_by(GpuLease.owner_id)):
            usage[owner] = Usage(int(n_open or 0), max(0.0, float(total or 0)) / 3600)
        return usage
    for owner, start, end in session.execute(select(GpuLease.owner_id, GpuLease.start_at,
                                                    GpuLease.end_at).where(recent)):
        u = usage.setdefault(owner, Usage())
        if end is None:
            u.gpus_held += 1
            end = now
        u.gpu_hours += max(0.0, (end - max(start, since)).total_seconds()) / 3600
    return usage


_hours_lock = threading.Lock()
_hours: dict[str, tuple[float, dict[str, float]]] = {}  # database -> (read at, hours)


def recent_gpu_hours(session: Session, now: datetime) -> dict[str, float]:
    """GPU-hours per owner over the window, re-read at most every HOURS_TTL_S per process:
    the fair-share tie-break between users holding as many GPUs; seconds of staleness
    move it by a negligible amount and save a statement in most decisions."""
    key = str(session.get_bind().engine.url)
    t = time.monotonic()
    with _hours_lock:
        hit = _hours.get(key)
    if hit is not None and t - hit[0] < HOURS_TTL_S:
        return hit[1]
    hours = {o: u.gpu_hours for o, u in usage_by_owner(session, now).items()}
    with _hours_lock:
        _hours[key] = (t, hours)
    return hours


def cpu_held(session: Session) -> dict[str, int]:
    """CPU slots (active gpus=0 jobs) per owner now: the per-user CPU bound of the policy."""
    return dict(session.execute(select(Job.owner_id, func.count())
                                .where(Job.gpus_requested == 0, Job.status.in_(LEASED))
                                .group_by(Job.owner_id)).all())
