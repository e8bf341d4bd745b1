"""Run one scheduling decision now (after a commit that may have freed or queued work)."""

from __future__ import annotations

import logging
import threading

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from app.core.db import after_commit, unit_of_work
from app.scheduler.service import schedule_once

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


def nudge_after_commit(session: Session) -> None:
    """One pass once this transaction commits, however many changes asked for it."""
    if not session.info.get("_nudge_registered"):
        session.info["_nudge_registered"] = True
        after_commit(session, nudge)
