"""What a scheduling decision reads (app/scheduler/reads.py), on PostgreSQL and SQLite: the
queued jobs come back in the policy's own order (`policy.job_order`: priority, then age, then
id), whatever order the table holds them in, and the placement-only read keeps exactly the
jobs that could change a placement."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import insert, text
from sqlalchemy.orm import Session

from app.models import Job, User
from app.scheduler.policy import NodeState, Waiting, few_that_matter, fit_counts, job_order
from app.scheduler.reads import (GPUS, HELD, ID, OWNER, PRIO, QAT, RESERVES_DISK, STATUS,
                                 UNSET, queued_in_order, waiting_rows)

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _fill(s: Session) -> list[dict]:
    """Ties on (priority, queued_at) inserted in descending id order, so that the order rows
    are stored in is not the policy's; one queued job without a queued_at; held, pending and
    disk-reserving jobs beside them."""
    s.execute(insert(User), [{"id": "usr_reads", "name": "reads", "role": "member"}])
    rows = []
    for i, (prio, age_s, gpus) in enumerate([(50, 10, 1), (70, 30, 2), (50, 10, 4), (50, 10, 2),
                                             (30, 50, 1), (70, 30, 1), (50, None, 1),
                                             (70, 5, 8), (50, 20, 0)]):
        rows.append({"id": f"job_r{9 - i:02d}", "type": "probe", "owner_id": "usr_reads",
                     "status": "queued", "priority": prio, "gpus_requested": gpus,
                     "queued_at": None if age_s is None else T0 - timedelta(seconds=age_s)})
    rows += [{"id": "job_rheld", "type": "probe", "owner_id": "usr_reads", "status": "queued",
              "priority": 90, "gpus_requested": 1, "held": True, "queued_at": T0},
             {"id": "job_rpend", "type": "probe", "owner_id": "usr_reads", "status": "pending",
              "priority": 90, "gpus_requested": 1},
             {"id": "job_rprep", "type": "prepare", "owner_id": "usr_reads", "status": "queued",
              "priority": 10, "gpus_requested": 0, "queued_at": T0,
              "fingerprint": "f" * 64}]
    s.execute(insert(Job), rows)
    s.flush()
    return rows


def _expected(rows: list[dict]) -> list[str]:
    q = [Waiting(r["id"], r["owner_id"], r["priority"], r["gpus_requested"],
                 r["queued_at"].timestamp() if r["queued_at"] else UNSET)
         for r in rows if r["status"] == "queued"]
    return [w.id for w in sorted(q, key=job_order)]


def _check(s: Session) -> None:
    rows = _fill(s)
    got = waiting_rows(s, with_reasons=True)
    assert sorted(r[ID] for r in got) == sorted(r["id"] for r in rows)
    assert [r[ID] for r in queued_in_order(got)] == _expected(rows)
    by_id = {r[ID]: r for r in got}
    assert by_id["job_r03"][QAT] == UNSET  # the queued job without a queued_at: last of its 50s
    assert by_id["job_rprep"][RESERVES_DISK] and not by_id["job_r09"][RESERVES_DISK]
    assert by_id["job_rheld"][HELD] and by_id["job_rpend"][STATUS] == "pending"
    # Placement only, at most 2 GPUs free on a node, no CPU slot, nothing aged: the jobs that
    # could start (1-2 GPUs, not held) and the pending one; 4- and 8-GPU jobs, the held one
    # and the CPU ones are left out.
    only = waiting_rows(s, with_reasons=False, only=(2, False, T0.timestamp() - 3600))
    assert sorted(r[ID] for r in only) == sorted(
        r["id"] for r in rows if r["status"] == "pending" or (
            not r.get("held") and 1 <= r["gpus_requested"] <= 2))
    assert all(r[GPUS] <= 2 and r[PRIO] for r in only)
    # The 8-GPU job waited past the bound: kept, as it may hold a node back.
    aged = waiting_rows(s, with_reasons=False, only=(2, True, T0.timestamp() - 1))
    assert "job_r02" in {r[ID] for r in aged} and "job_r01" in {r[ID] for r in aged}


def test_queued_rows_come_in_policy_order_postgresql(db):
    _check(db)


def test_queued_rows_come_in_policy_order_sqlite(tmp_path):
    from app.core.db import make_engine
    from app.core.migrate import upgrade_head

    url = f"sqlite:///{tmp_path / 'reads.sqlite'}"
    upgrade_head(url)
    eng = make_engine(url)
    try:
        with Session(eng) as s:
            _check(s)
    finally:
        eng.dispose()


@pytest.mark.parametrize("n", [0, 1])
def test_an_empty_or_single_queue(db, n):
    db.execute(insert(User), [{"id": "usr_one", "name": "one", "role": "member"}])
    if n:
        db.execute(insert(Job), [{"id": "job_one", "type": "probe", "owner_id": "usr_one",
                                  "status": "queued", "priority": 50, "gpus_requested": 1,
                                  "queued_at": T0}])
    assert [r[ID] for r in queued_in_order(waiting_rows(db, False, (8, True, 0.0)))] == \
        ["job_one"] * n


@pytest.mark.parametrize("seed", range(6))
def test_postgresql_reads_the_jobs_few_that_matter_keeps(db, seed):
    """The placement-only read on PostgreSQL (reads._FEW_PG, through the partial indexes of
    migration s40_queue_indexes) returns exactly the queued jobs `policy.few_that_matter`
    keeps, plus the pending ones: each owner's first fit_counts[g] g-GPU jobs in the policy's
    order (ties on priority and age broken by id as Python compares it), the aged ones, the
    CPU ones while a slot is free, the jobs a preemption frees a node for."""
    rng = random.Random(seed)
    owners = ["usr_fa", "usr_fb", "usr_Fc"]
    db.execute(insert(User), [{"id": o, "name": o, "role": "member"} for o in owners])
    rows = [{"id": f"job_{rng.choice('aAbB_')}{i:03d}", "type": "probe",
             "owner_id": rng.choice(owners),
             "status": "pending" if rng.random() < 0.05 else "queued",
             "priority": rng.choice([30, 50, 70]), "gpus_requested": rng.randint(0, 5),
             "held": rng.random() < 0.1,
             "queued_at": T0 - timedelta(seconds=rng.choice([10, 10, 20, 400, 900]))}
            for i in range(150)]
    db.execute(insert(Job), rows)
    db.flush()
    nodes = [NodeState(f"n{k}", rng.sample(range(8), rng.randint(0, 4)), 8)
             for k in range(rng.randint(1, 3))]
    caps, cpu = fit_counts(nodes), rng.random() < 0.5
    keep = {rng.choice([r["id"] for r in rows])}
    now, bound = T0.timestamp(), 300.0
    only = (len(caps) - 1, cpu, now - bound)
    got = waiting_rows(db, False, only, (caps, keep))
    ws = [Waiting(r[ID], r[OWNER], r[PRIO], r[GPUS], r[QAT], r[HELD])
          for r in queued_in_order(waiting_rows(db, True))]
    want = few_that_matter(ws, nodes, int(cpu), now, bound, keep)
    assert sorted(r[ID] for r in got) == sorted(
        [w.id for w in want] + [r["id"] for r in rows if r["status"] == "pending"])
    assert len(got) == len({r[ID] for r in got})
    assert len(want) < len(ws)


def test_no_node_reason_never_reuses_a_too_small_answer(db):
    """The submit-time check (reads.no_gpu_node_reason) reuses only a recent 'a node is big
    enough' answer: a job no node fits is told so at once, and a node that joins is seen by
    the next submit."""
    from app.cluster.service import register_node
    from app.scheduler.reads import no_gpu_node_reason

    db.execute(text("DELETE FROM nodes"))
    assert "no schedulable node" in (no_gpu_node_reason(db, 1) or "")
    register_node(db, "r1", [{"index": i} for i in range(2)], hostname="t", cpu_slots=0,
                  info={})
    db.flush()
    assert no_gpu_node_reason(db, 2) is None
    assert "largest schedulable node has 2" in (no_gpu_node_reason(db, 4) or "")
    assert no_gpu_node_reason(db, 1) is None
