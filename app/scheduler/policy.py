"""Scheduling policy as pure functions (no DB): who runs next and where.

Order: priority, then fair share between users (fewer GPUs held now, then fewer recent
GPU-hours), then age. A GPU job that does not fit waits; smaller jobs may pass it only until
it has waited `backfill_bound_s` (aging), after which GPUs are held back for it: no starvation.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field


@dataclass
class Waiting:
    id: str
    owner: str
    priority: int
    gpus: int
    queued_at: float  # epoch seconds
    held: bool = False


@dataclass
class NodeState:
    name: str
    free: list[int]           # free GPU indices
    total: int
    cpu_free: int = 0
    schedulable: bool = True  # alive and not draining


@dataclass
class Usage:
    gpus_held: int = 0
    gpu_hours: float = 0.0


@dataclass
class Plan:
    dispatch: list[tuple[str, str | None, list[int]]] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)


def _place(nodes: list[NodeState], n: int) -> NodeState | None:
    """Best fit: the schedulable node with the fewest free GPUs that still fits n."""
    fits = [nd for nd in nodes if nd.schedulable and len(nd.free) >= n]
    return min(fits, key=lambda nd: (len(nd.free), nd.name)) if fits else None


def plan(waiting: list[Waiting], nodes: list[NodeState], usage: dict[str, Usage], *,
         now: float, quota: int = 0, backfill_bound_s: float = 300.0, cpu_free: int = 0) -> Plan:
    out = Plan()
    usage = {k: Usage(v.gpus_held, v.gpu_hours) for k, v in usage.items()}
    total_gpus = sum(nd.total for nd in nodes if nd.schedulable)
    max_node = max((nd.total for nd in nodes if nd.schedulable), default=0)

    # Per user: own jobs by (priority desc, age). Across users: a heap on the head job.
    per_user: dict[str, list[Waiting]] = {}
    for w in waiting:
        per_user.setdefault(w.owner, []).append(w)
    for lst in per_user.values():
        lst.sort(key=lambda w: (-w.priority, w.queued_at, w.id))
        lst.reverse()  # pop() from the end = best first

    def key(owner: str):
        w = per_user[owner][-1]
        u = usage.get(owner, Usage())
        return (-w.priority, u.gpus_held, u.gpu_hours, w.queued_at, w.id)

    heap = [(key(o), o) for o in per_user]
    heapq.heapify(heap)
    reserved = False  # an aged big job holds the GPUs back from smaller ones
    free_total = sum(len(nd.free) for nd in nodes if nd.schedulable)
    cpu_left = cpu_free
    while heap:
        k, owner = heapq.heappop(heap)
        if k != key(owner):  # usage changed since pushed: re-key
            heapq.heappush(heap, (key(owner), owner))
            continue
        w = per_user[owner].pop()
        out.order.append(w.id)
        if per_user[owner]:
            heapq.heappush(heap, (key(owner), owner))
        u = usage.setdefault(owner, Usage())
        if w.held:
            out.reasons[w.id] = "held by its owner or an admin"
            continue
        if w.gpus == 0:
            if cpu_left > 0:
                cpu_left -= 1
                out.dispatch.append((w.id, None, []))
            else:
                out.reasons[w.id] = "waiting for a CPU slot (all busy)"
            continue
        if w.gpus > max_node:
            out.reasons[w.id] = (f"needs {w.gpus} GPUs on one node; the largest schedulable "
                                 f"node has {max_node}" if total_gpus else
                                 "no schedulable node with GPUs is registered")
            continue
        if quota and u.gpus_held + w.gpus > quota:
            out.reasons[w.id] = f"user quota {quota} GPUs reached ({u.gpus_held} held)"
            continue
        if reserved:
            out.reasons[w.id] = "GPUs held back for an older job that has waited too long"
            continue
        nd = _place(nodes, w.gpus)
        if nd is None:
            out.reasons[w.id] = f"waiting for {w.gpus} GPUs, {free_total} free"
            if now - w.queued_at > backfill_bound_s:
                reserved = True
            continue
        take = sorted(nd.free)[: w.gpus]
        nd.free = [i for i in nd.free if i not in take]
        free_total -= w.gpus
        u.gpus_held += w.gpus
        out.dispatch.append((w.id, nd.name, take))
    return out
