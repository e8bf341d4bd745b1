"""A job's preemption history (`job.preemption["history"]`: epoch seconds of its past
preemptions). Job data, so it lives with the jobs: the job service appends to it, the job's
read shows it, and the scheduler's pure policy (app/scheduler/preempt.py) reads it to cap how
often one job may be preempted."""

from __future__ import annotations

HOUR_S = 3600.0


def recent(history: list[float] | None, now: float) -> list[float]:
    """The preemptions within the last hour (the window `preempt_max_per_hour` counts in)."""
    return [t for t in (history or []) if now - t < HOUR_S]
