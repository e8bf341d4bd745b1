"""What a scheduling decision reads (app/scheduler/reads.py), on PostgreSQL and SQLite: the
queued jobs come back in the policy's own order (`policy.job_order`: priority, then age, then
id), whatever order the table holds them in, and the placement-only read keeps exactly the
jobs that could change a placement."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import insert
from sqlalchemy.orm import Session

from app.models import Job, User
from app.scheduler.policy import Waiting, job_order
from app.scheduler.reads import (GPUS, HELD, ID, PRIO, QAT, RESERVES_DISK, STATUS, UNSET,
                                 queued_in_order, waiting_rows)

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
