"""Preemption policy as pure functions (no DB): which running jobs yield their GPUs to a
higher-priority job that cannot start otherwise.

Rules:
- Only a job that waits for GPUs (not held, not over its owner's quota, small enough for
  some node) may preempt, and only jobs of strictly lower priority: never for an equal one.
- Only preemptible jobs that are `running` (their stage checkpoints on SIGTERM) are chosen;
  a job already being preempted, or preempted `max_per_hour` times in the last hour, is not.
- On a node, victims are taken lowest priority first (then the most recently started, which
  loses the least work) until the waiting job fits; the node that needs the fewest GPUs
  taken (then the lowest victim priority) wins. Nothing is preempted unless the waiting job
  then fits on that one node.
- While victims checkpoint, their node is held for the waiting job (`held_for`), so a
  smaller job cannot take the GPUs they free one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.jobs.preemption import recent


@dataclass(slots=True)
class Holder:
    """A job holding GPUs on a node."""

    id: str
    priority: int
    gpus: list[int]
    preemptible: bool = False
    running: bool = True           # dispatched/cancelling jobs are never chosen
    preempt_by: str | None = None  # being preempted for this job now
    history: list[float] = field(default_factory=list)  # epoch s of past preemptions
    started_at: float = 0.0


@dataclass(slots=True)
class Preemption:
    waiter: str
    waiter_priority: int
    node: str
    victims: list[str]


def held_for(holders_by_node: dict[str, list[Holder]]) -> dict[str, str]:
    """node -> the job its preemptions in flight free GPUs for."""
    out: dict[str, str] = {}
    for node, hs in holders_by_node.items():
        for h in hs:
            if h.preempt_by:
                out.setdefault(node, h.preempt_by)
    return out


def choose(waiters: list[tuple[str, int, int]], free: dict[str, int], totals: dict[str, int],
           holders_by_node: dict[str, list[Holder]], *, now: float,
           max_per_hour: int, reserved: dict[str, str] | None = None) -> list[Preemption]:
    """`waiters`: (id, priority, gpus) of jobs waiting for GPUs, in policy order. `free`:
    free GPUs per schedulable node after this pass's placements; `totals`: GPUs per node.
    `reserved`: node -> the aged job the plan holds it back for (policy.Schedule.reserved):
    nothing else starts there, so nothing is preempted there for another job either (its
    GPUs would go to that job, and the aged job would lose the node it waits on)."""
    busy = held_for(holders_by_node)  # nodes already being freed for someone
    reserved = reserved or {}
    served = set(busy.values())
    taken: set[str] = set()
    out: list[Preemption] = []
    for wid, prio, n in waiters:
        if wid in served:
            continue
        best: tuple | None = None
        for node, nfree in free.items():
            if node in busy or reserved.get(node, wid) != wid or totals.get(node, 0) < n \
                    or nfree >= n:
                continue
            cands = sorted((h for h in holders_by_node.get(node, ())
                            if h.preemptible and h.running and not h.preempt_by
                            and h.id not in taken and h.priority < prio
                            and len(recent(h.history, now)) < max_per_hour),
                           key=lambda h: (h.priority, -h.started_at, h.id))
            got, chosen = nfree, []
            for h in cands:
                if got >= n:
                    break
                chosen.append(h)
                got += len(h.gpus)
            if got < n:
                continue
            key = (sum(len(h.gpus) for h in chosen), max(h.priority for h in chosen), node)
            if best is None or key < best[0]:
                best = (key, node, chosen)
        if best is None:
            continue
        _key, node, chosen = best
        busy[node] = wid
        taken.update(h.id for h in chosen)
        out.append(Preemption(wid, prio, node, [h.id for h in chosen]))
    return out
