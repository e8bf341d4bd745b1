"""Scheduling policy as pure functions (no DB): who runs next and where.

Order: priority, then fair share between users (fewer GPUs held now, then fewer recent
GPU-hours), then age. A GPU job that does not fit waits; smaller jobs may pass it only until
it has waited `backfill_bound_s` (aging). After that, while it still fits on no node at the
start of a decision, it goes first within its priority and reserves the node closest to
fitting it: nothing new starts there until it fits, so it waits at most for that node's
running jobs (no starvation). Jobs may still start on the other nodes.

Aging is for jobs that are passed over because they do not fit. An aged job that fits when
the decision starts keeps its fair-share place: promoting every job older than the bound
would serve any backlog older than it first come, first served, whatever its owners' usage
(tests/scheduler/test_fairness_sim.py measured 0.98 / 0.02 between two equal users, and a
light user waiting behind the whole backlog). Passed over in this decision, it is promoted in
the next one if it then does not fit.

A user's CPU jobs, GPU jobs and promoted GPU jobs queue separately (each in priority, then age
order), so a job that cannot start never keeps its owner's others from their turn (a CPU job
waiting for a slot, a promoted job above all): a job that cannot start changes nothing for the
jobs after it, which is what lets `could_matter` leave such jobs out of a placement-only plan.

CPU slots (jobs with gpus=0) go in the same order, but while another user's CPU job waits, no
user holds more than `user_cpu_slots` of them (default: all but one), so one user's long
probes cannot starve everyone's ingests; a user alone may use them all.

Placement is best fit (the node with the fewest free GPUs that still fits), which keeps
whole nodes free for big jobs. A GPU is handed out at most once per plan.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from itertools import filterfalse
from operator import attrgetter


@dataclass(slots=True)
class Waiting:
    id: str
    owner: str
    priority: int
    gpus: int
    queued_at: float  # epoch seconds
    held: bool = False


_GPUS, _HELD = attrgetter("gpus"), attrgetter("held")


@dataclass
class NodeState:
    name: str
    free: list[int]           # free GPU indices
    total: int
    cpu_free: int = 0
    schedulable: bool = True  # alive and not draining
    # Jobs holding its GPUs (preempt.Holder), read only for preemption decisions.
    holders: list = field(default_factory=list)


@dataclass
class Usage:
    gpus_held: int = 0
    gpu_hours: float = 0.0
    cpu_held: int = 0  # CPU slots (gpus=0 jobs) running now


@dataclass
class Schedule:
    """One scheduling pass's decision: what starts where, and why the rest waits (the run's
    dry-run answer is another thing, workers/stages/plan.py `Plan`)."""

    dispatch: list[tuple[str, str | None, list[int]]] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    # Jobs in the order the policy considered them (dispatched ones included); with `top`
    # set, jobs past the top that could not start anyway are left out.
    order: list[str] = field(default_factory=list)
    reserved: dict[str, str] = field(default_factory=dict)  # node -> aged job holding it
    # Jobs that wait only for GPUs to free up (candidates to preempt for; app/scheduler/preempt.py).
    gpu_waits: list[str] = field(default_factory=list)


def _place(nodes: list[NodeState], n: int, skip: dict[str, str]) -> NodeState | None:
    """Best fit: the schedulable, unreserved node with the fewest free GPUs that fits n."""
    fits = [nd for nd in nodes if nd.schedulable and nd.name not in skip and len(nd.free) >= n]
    return min(fits, key=lambda nd: (len(nd.free), nd.name)) if fits else None


def _reserve_for(nodes: list[NodeState], n: int, skip: dict[str, str]) -> NodeState | None:
    """The node an aged job waits on: big enough, unreserved, closest to fitting it."""
    able = [nd for nd in nodes if nd.schedulable and nd.name not in skip and nd.total >= n]
    return min(able, key=lambda nd: (-len(nd.free), nd.name)) if able else None


def _free_text(nodes: list[NodeState], n: int) -> str:
    live = [nd for nd in nodes if nd.schedulable]
    total = sum(len(nd.free) for nd in live)
    best = max((len(nd.free) for nd in live), default=0)
    if best == total:
        return f"waiting for {n} GPUs, {total} free"
    return f"waiting for {n} GPUs on one node, {best} free on the emptiest ({total} free in all)"


def job_order(w: Waiting) -> tuple:
    """A user's own jobs: higher priority first, then older first."""
    return (-w.priority, w.queued_at, w.id)


def could_matter(w: Waiting, most_free: int, cpu_free: int, now: float,
                 backfill_bound_s: float) -> bool:
    """Whether a job can change a placement-only plan: it could start (a CPU slot or a node
    with enough free GPUs now; GPUs only get fewer during a plan), or it waited past the
    bound (it may hold a node back). Others are only given a reason, so a plan over the jobs
    that could matter places exactly what a plan over all of them places.
    app/scheduler/reads.py asks the database for these same jobs."""
    if w.held:
        return False
    if w.gpus == 0:
        return cpu_free > 0
    return w.gpus <= most_free or now - w.queued_at > backfill_bound_s


def fit_counts(nodes: list[NodeState]) -> list[int]:
    """[g] = how many g-GPU jobs could start on the schedulable nodes' free GPUs now (index
    0 unused): no owner's (g+1)-th waiting g-GPU job can start in a decision."""
    most = max((len(nd.free) for nd in nodes if nd.schedulable), default=0)
    return [0] + [sum(len(nd.free) // g for nd in nodes if nd.schedulable)
                  for g in range(1, most + 1)]


def few_that_matter(waiting: list[Waiting], nodes: list[NodeState], cpu_free: int, now: float,
                    backfill_bound_s: float, keep: set[str] | frozenset = frozenset()
                    ) -> list[Waiting]:
    """The jobs a placement-only plan needs, from `waiting` in `job_order`: those that
    `could_matter`, less each owner's g-GPU jobs past the first `fit_counts(nodes)[g]`
    (unless aged, or in `keep`: jobs a preemption frees a node for). Along one owner's g-GPU
    jobs a job that cannot start (no node fits g, the quota, a node held back) is followed by
    jobs that cannot either (free GPUs only get fewer, usage and reservations only grow), and
    the first `fit_counts[g]` of them starting leave no room for another; a job that cannot
    start changes nothing for the jobs after it (see the module's docstring). So the plan
    places the same jobs from these as from all (tests/scheduler/test_policy.py).
    app/scheduler/reads.py asks PostgreSQL for these same jobs, through a partial index."""
    caps = fit_counts(nodes)
    most = len(caps) - 1
    seen: Counter[tuple[str, int]] = Counter()
    out = []
    for w in waiting:
        if w.held:
            continue
        if w.gpus and w.gpus <= most:
            seen[w.owner, w.gpus] += 1
            if (seen[w.owner, w.gpus] <= caps[w.gpus] or w.id in keep
                    or now - w.queued_at > backfill_bound_s):
                out.append(w)
        elif w.id in keep or could_matter(w, most, cpu_free, now, backfill_bound_s):
            out.append(w)
    return out


def plan(waiting: list[Waiting], nodes: list[NodeState], usage: dict[str, Usage], *,
         now: float, quota: int = 0, backfill_bound_s: float = 300.0, cpu_free: int = 0,
         top: int | None = None, presorted: bool = False,
         held_for: dict[str, str] | None = None, user_cpu_slots: int = 0) -> Schedule:
    """Decide what starts now and why the rest waits.

    `top`: how many waiting jobs need a position and a reason; past it the walk stops as soon
    as nothing else could start (keeps a decision cheap with thousands queued).
    `held_for`: node -> job whose preemptions free that node (only that job starts there).
    `presorted`: `waiting` is already in `job_order` (the database sorted it; sorting 10,000
    jobs in Python would cost more than the rest of a decision).
    `user_cpu_slots`: CPU slots one user may hold while another user's CPU job waits
    (0: all the slots but one, at least one).
    """
    d = _Decision(nodes, usage, now=now, quota=quota, bound_s=backfill_bound_s,
                  cpu_free=cpu_free, held_for=held_for or {}, user_cpu_slots=user_cpu_slots)
    d.queue(waiting if presorted else sorted(waiting, key=job_order))
    while d.heap:
        if top is not None and d.waiting_count >= top and not d.could_start():
            break
        d.step()
    d.quote_free_gpus()
    return d.out


PROMOTED = 2  # the index of the promoted queues in _Decision.queues


class _Decision:
    """One plan's state as it walks the queue: the nodes' free GPUs and the users' usage as
    the plan starts jobs, each user's queues, and the heap on their heads."""

    def __init__(self, nodes: list[NodeState], usage: dict[str, Usage], *, now: float,
                 quota: int, bound_s: float, cpu_free: int, held_for: dict[str, str],
                 user_cpu_slots: int) -> None:
        self.out = Schedule()
        self.out.reserved.update(held_for)
        self.held_for = held_for
        self.now, self.quota, self.bound_s = now, quota, bound_s
        self.nodes = [NodeState(nd.name, list(nd.free), nd.total, nd.cpu_free, nd.schedulable)
                      for nd in nodes]
        self.usage = {k: Usage(v.gpus_held, v.gpu_hours, v.cpu_held) for k, v in usage.items()}
        self.cpu_cap = user_cpu_slots or max(
            1, cpu_free + sum(u.cpu_held for u in self.usage.values()) - 1)
        live = [nd for nd in self.nodes if nd.schedulable]
        self.max_node = max((nd.total for nd in live), default=0)
        self.most_free = max((len(nd.free) for nd in live), default=0)
        self.cpu_left = cpu_free
        self.waiting_count = 0  # jobs given a position (considered and not started)
        self.gpu_waits: list[tuple[str, int]] = []  # reasons quoting free GPUs, at the end
        self.gpu_starts: Counter[str] = Counter()  # GPU jobs started by this plan, per owner
        # Per user, a queue of CPU jobs, one of GPU jobs and one of promoted GPU jobs, each
        # by (priority desc, age); across them, a heap on each queue's head. Separate queues
        # keep the keys along a queue non-decreasing: a promoted job (keyed first within its
        # priority) never sits behind an older job of its owner keyed by fair share.
        self.queues: tuple[dict[str, list[Waiting]], ...] = ({}, {}, {})
        self.heap: list[tuple] = []
        self.cpu_waiting: Counter[str] = Counter()
        self.left: Counter[int] = Counter()  # GPU counts of the jobs not yet considered

    def promoted(self, w: Waiting) -> bool:
        """Aged and fitting on no node now: first within its priority, holds a node."""
        return bool(w.gpus) and w.gpus > self.most_free and self.now - w.queued_at > self.bound_s

    def queue(self, waiting: list[Waiting]) -> None:
        """Jobs in `job_order` into their owners' queues, and the heap on the queues' heads.
        Once per waiting job, so as lean as it can be (10,000 of them in a decision): the
        test of `promoted` inlined, the counts by C-level iteration."""
        cpu_q, gpu_q, promoted_q = self.queues
        most_free, now, bound_s = self.most_free, self.now, self.bound_s
        for w in waiting:
            if not w.gpus:
                cpu_q.setdefault(w.owner, []).append(w)
            elif w.gpus > most_free and now - w.queued_at > bound_s:
                promoted_q.setdefault(w.owner, []).append(w)
            else:
                gpu_q.setdefault(w.owner, []).append(w)
        for qs in self.queues:
            for lst in qs.values():
                lst.reverse()  # pop() = best
        self.cpu_waiting = Counter({o: n for o, q in cpu_q.items()
                                    if (n := sum(1 for w in q if not w.held))})
        self.left = Counter(map(_GPUS, filterfalse(_HELD, waiting)))
        # (key, owner, which of its queues, its owner's GPU starts when pushed); keys unique.
        self.heap = [(self.key(q[-1]), o, kind, 0) for kind, qs in enumerate(self.queues)
                     for o, q in qs.items()]
        heapq.heapify(self.heap)

    def key(self, w: Waiting) -> tuple:
        # A promoted job goes before its owner's other jobs of its priority (they may not pass
        # it), at its owner's fair-share turn (it does not pass lighter users' jobs).
        u = self.usage.get(w.owner) or Usage()
        return (-w.priority, u.gpus_held, u.gpu_hours, 0 if self.promoted(w) else 1,
                w.queued_at, w.id)

    def could_start(self) -> bool:
        """Whether a job not yet considered could still start."""
        if self.cpu_left > 0 and self.left[0] > 0:
            return True
        sizes = [n for n, c in self.left.items() if n and c > 0]
        if not sizes:
            return False
        most = max((len(nd.free) for nd in self.nodes
                    if nd.schedulable and nd.name not in self.out.reserved), default=0)
        return min(sizes) <= most

    def step(self) -> None:
        """Decide on the job at the head of the heap.

        Only the popped user's usage can change, so every key in the heap stays current but
        those of the owner's other queues once a GPU job of theirs started (GPUs held only
        grow, so they are too small, never too large). Popped, such a queue goes back in with
        its key brought up to date. A queue's next job is pushed once this one is decided."""
        _, owner, kind, seen = heapq.heappop(self.heap)
        q = self.queues[kind][owner]
        if seen != self.gpu_starts[owner]:
            heapq.heappush(self.heap, (self.key(q[-1]), owner, kind, self.gpu_starts[owner]))
            return
        w = q.pop()
        self.out.order.append(w.id)
        if w.held:
            self.out.reasons[w.id] = "held by its owner or an admin"
            started = False
        else:
            self.left[w.gpus] -= 1
            started = self.cpu_job(w) if w.gpus == 0 else self.gpu_job(w, kind)
        if not started:
            self.waiting_count += 1
        if q:
            heapq.heappush(self.heap, (self.key(q[-1]), owner, kind, self.gpu_starts[owner]))

    def cpu_job(self, w: Waiting) -> bool:
        """A CPU slot if one is free and its owner is under the per-user bound while others
        wait; else the reason."""
        u = self.usage.setdefault(w.owner, Usage())
        self.cpu_waiting[w.owner] -= 1
        others = sum(self.cpu_waiting.values()) - self.cpu_waiting[w.owner] > 0
        if self.cpu_left > 0 and u.cpu_held >= self.cpu_cap and others:
            self.out.reasons[w.id] = (f"user CPU slot limit {self.cpu_cap} reached while "
                                      "others wait for one")
            return False
        if self.cpu_left > 0:
            self.cpu_left -= 1
            u.cpu_held += 1
            self.out.dispatch.append((w.id, None, []))
            return True
        self.out.reasons[w.id] = "waiting for a CPU slot (all busy)"
        return False

    def gpu_job(self, w: Waiting, kind: int) -> bool:
        """Best fit on a node not held back for another job; else the reason, and a promoted
        job that fits nowhere reserves the node closest to fitting it."""
        out = self.out
        if w.gpus > self.max_node:
            out.reasons[w.id] = (f"needs {w.gpus} GPUs on one node; the largest schedulable "
                                 f"node has {self.max_node}" if self.max_node else
                                 "no schedulable node with GPUs is registered")
            return False
        if self.quota and (u := self.usage.get(w.owner) or Usage()).gpus_held + w.gpus > \
                self.quota:
            out.reasons[w.id] = f"user quota {self.quota} GPUs reached ({u.gpus_held} held)"
            return False
        skip = ({k: v for k, v in out.reserved.items() if v != w.id} if self.held_for
                else out.reserved)
        if (nd := _place(self.nodes, w.gpus, skip)) is not None:
            take = sorted(nd.free)[: w.gpus]
            nd.free = [i for i in nd.free if i not in take]
            self.usage.setdefault(w.owner, Usage()).gpus_held += w.gpus
            self.gpu_starts[w.owner] += 1
            out.dispatch.append((w.id, nd.name, take))
            return True
        if _place(self.nodes, w.gpus, {}) is not None:
            # It would fit, but only on nodes held back for older jobs.
            holders = sorted(set(out.reserved.values()) - set(self.held_for.values()))
            freed = sorted(set(self.held_for.values()))
            out.reasons[w.id] = (f"GPUs held back for {', '.join(holders)}, waiting longer "
                                 f"than {self.bound_s:g}s" if holders else
                                 f"GPUs being freed by preemption for {', '.join(freed)}")
            return False
        self.gpu_waits.append((w.id, w.gpus))
        out.gpu_waits.append(w.id)
        if kind == PROMOTED and (r := _reserve_for(self.nodes, w.gpus, out.reserved)):
            out.reserved[r.name] = w.id
        return False

    def quote_free_gpus(self) -> None:
        """The reasons of the jobs that wait for GPUs, quoting what is free once the plan
        has placed everything, and the node held for each aged job."""
        for job_id, n in self.gpu_waits:
            text = _free_text(self.nodes, n)
            mine = [nd for nd, j in self.out.reserved.items() if j == job_id]
            if mine and self.held_for.get(mine[0]) == job_id:
                text += (f"; lower-priority jobs on {mine[0]} are checkpointing to yield "
                         "their GPUs to it (preemption)")
            elif mine:
                text += f"; waited over {self.bound_s:g}s, so {mine[0]} is held for it"
            self.out.reasons[job_id] = text
