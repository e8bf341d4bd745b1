"""Run one scheduling decision now: after a commit that may have freed or queued work, or
inside a submit's own transaction when the scheduler lock is free (`place_now`)."""

from __future__ import annotations

import logging
import threading

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from app.core.db import after_commit, is_sqlite, unit_of_work
from app.scheduler.service import SCHEDULING, schedule_once, try_lock

log = logging.getLogger("draftyard.scheduler")

# Coalescing within a process: while one thread of this process waits for the scheduler lock
# to make a pass, more nudges from this process add nothing (that pass reads the queue only
# after it holds the lock, so it sees every commit made before it stopped waiting). Without
# this, a burst of submits queues one full pass per request behind the lock.
_guard = threading.Lock()
_waiter: object | None = None  # the nudge of this process now waiting for the lock


def nudge(with_reasons: bool = False) -> None:
    """A decision after a submit or a job's end: placement only. Queue positions and pending
    reasons are refreshed by the nodes' once-a-second tick (`with_reasons=True`, never
    coalesced): rewriting the positions of the first 1000 waiting jobs on every submit would
    cost more than the decision itself."""
    global _waiter
    me = object()

    def _stop_waiting() -> None:  # lock held: from here a new commit may be missed
        global _waiter
        with _guard:
            if _waiter is me:
                _waiter = None

    if not with_reasons:
        with _guard:
            if _waiter is not None:
                return
            _waiter = me
    try:
        for attempt in range(3):
            try:
                with unit_of_work() as s:
                    schedule_once(s, with_reasons=with_reasons, on_locked=_stop_waiting)
                return
            except OperationalError as e:  # lock timeouts, deadlock on lease rows: try again
                log.warning("scheduling pass failed (attempt %d): %s", attempt + 1, e)
            except Exception:  # the periodic tick recovers
                log.exception("scheduling pass failed")
                return
    finally:
        _stop_waiting()


# The session-info key saying a nudge is registered to run after this transaction commits.
NUDGE_ASKED = "_nudge_registered"


def nudge_after_commit(session: Session) -> None:
    """One pass once this transaction commits, however many changes asked for it."""
    if not session.info.get(NUDGE_ASKED):
        session.info[NUDGE_ASKED] = True
        after_commit(session, nudge)


def place_now(session: Session) -> None:
    """The placement pass of a submit inside the submit's own transaction, when the scheduler
    lock is free now: the job is placed by the commit that creates it, without the second
    transaction (a session, BEGIN, the lock, COMMIT) of the nudge after commit, which this
    pass then replaces. The lock held by another pass, or a pass that fails (in a savepoint:
    the submit itself stands): the nudge after commit runs, as for every other change. SQLite
    (embedded mode) keeps the nudge: its one writer has nothing to race."""
    if not session.info.get(NUDGE_ASKED) or is_sqlite(session):
        return
    was = session.info.get(SCHEDULING)
    try:
        with session.begin_nested():
            if not try_lock(session):
                return
            schedule_once(session, with_reasons=False, locked=True)
    except OperationalError as e:  # lock timeout, deadlock on lease rows: the nudge retries
        log.warning("placement in the submit's transaction failed: %s", e)
        return
    finally:
        session.info[SCHEDULING] = was  # later changes in this session wake the scheduler
    hooks = session.info.get("after_commit", [])
    if nudge in hooks:  # this pass saw everything the nudge would: it is the pass
        hooks.remove(nudge)
        session.info.pop(NUDGE_ASKED, None)  # a later change asks for one again
