"""The job state machine (docs/API.md "Status"). Every change goes through `transition`, so an
illegal one is a 409, never a silent change."""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    pending = "pending"        # waits for inputs (jobs it depends on)
    queued = "queued"          # waits for resources
    dispatched = "dispatched"  # resources leased, task sent, not yet claimed by a worker
    running = "running"
    cancelling = "cancelling"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


S = JobStatus
# The status sets, each defined here only (the scheduler's SQL, storage and the CLI use them).
TERMINAL = frozenset({S.succeeded, S.failed, S.cancelled})  # final: nothing will run
# Placed on a node: holds its GPU lease and its disk reservation until it ends.
LEASED = frozenset({S.dispatched, S.running, S.cancelling})
WAITING = frozenset({S.pending, S.queued})                   # not placed yet
UNFINISHED = WAITING | LEASED                                # not final: may still read inputs

ALLOWED: dict[JobStatus, frozenset[JobStatus]] = {
    S.pending: frozenset({S.queued, S.cancelled, S.failed}),
    # queued -> succeeded: reuse of a matching finished job's artifact.
    S.queued: frozenset({S.dispatched, S.cancelled, S.pending, S.succeeded, S.failed}),
    # dispatched -> queued: the reaper or a failed send gives the lease back.
    S.dispatched: frozenset({S.running, S.queued, S.cancelled, S.failed}),
    S.running: frozenset({S.succeeded, S.failed, S.cancelling, S.queued}),
    S.cancelling: frozenset({S.cancelled, S.failed, S.succeeded}),
    S.succeeded: frozenset(),
    S.failed: frozenset({S.queued, S.pending}),      # retry
    S.cancelled: frozenset({S.queued, S.pending}),   # retry
}


class IllegalTransition(Exception):
    def __init__(self, current: str, new: str):
        super().__init__(f"cannot go from {current} to {new}")
        self.current = current
        self.new = new


def check(current: str, new: str) -> None:
    if JobStatus(new) not in ALLOWED[JobStatus(current)]:
        raise IllegalTransition(current, new)
