"""Job lifecycle events: `transition()` (and its compare-and-set twin `cas_status()`) announce
every status change here, and the domains that care subscribe (see `app/wiring.py`).

Why: what must follow a job's end (a dataset becomes ready or failed, a run's status moves,
the scheduler wakes) used to be remembered by each call site, and one that forgot (cancel of a
queued job) left datasets `ingesting` forever. Now no call site has to remember."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session

from app.models import Job


@dataclass(frozen=True)
class StatusChanged:
    job: Job
    old: str | None
    new: str


Listener = Callable[[Session, StatusChanged], None]
Waker = Callable[[Session], None]
_listeners: list[Listener] = []
_wakers: list[Waker] = []
_placers: list[Waker] = []


def subscribe(fn: Listener) -> None:
    """Idempotent: wiring may run more than once in a process (app factory, worker, tests)."""
    if fn not in _listeners:
        _listeners.append(fn)


def subscribe_wake(fn: Waker) -> None:
    if fn not in _wakers:
        _wakers.append(fn)


def subscribe_place(fn: Waker) -> None:
    if fn not in _placers:
        _placers.append(fn)


def submitted(session: Session) -> None:
    """A submit whose transaction commits next: whoever schedules may place the new job
    inside that transaction (app/scheduler/nudge.place_now) instead of after the commit."""
    for fn in list(_placers):
        fn(session)


def queue_changed(session: Session) -> None:
    """Something the scheduler weighs changed without a status change (a pending job added,
    a priority, a hold, a node back from draining): whoever schedules should look again."""
    for fn in list(_wakers):
        fn(session)


def wired() -> bool:
    return bool(_listeners)


def announce(session: Session, job: Job, old: str | None, new: str) -> None:
    """Called by `transition()`/`cas_status()` alone, after the job's fields are set. A process
    that changes job status without wiring would silently skip the hooks: refuse instead."""
    if not _listeners:
        raise RuntimeError("job lifecycle not wired: call app.wiring.wire() at process start")
    ev = StatusChanged(job, old, new)
    for fn in list(_listeners):
        fn(session, ev)
