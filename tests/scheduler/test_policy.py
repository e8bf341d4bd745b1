"""The pure scheduling policy (app/scheduler/policy.py): order, fair share, quota, aging,
placement, and that a plan never hands out a GPU twice."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.scheduler.policy import (NodeState, Usage, Waiting, could_matter, few_that_matter,
                                  job_order, plan)

NOW = 1_000_000.0


def node(name: str, free: list[int], total: int = 8, ok: bool = True) -> NodeState:
    return NodeState(name=name, free=list(free), total=total, schedulable=ok)


def job(id_: str, owner: str, gpus: int, *, prio: int = 50, age: float = 1.0,
        held: bool = False) -> Waiting:
    return Waiting(id_, owner, prio, gpus, NOW - age, held)


def started(p) -> list[str]:
    return [j for j, _, _ in p.dispatch]


# ---- order ------------------------------------------------------------------------------

def test_higher_priority_goes_first_even_if_younger_and_owner_uses_more():
    p = plan([job("low", "a", 4, prio=10, age=200), job("high", "b", 4, prio=90, age=1)],
             [node("n", [0, 1, 2, 3])], {"b": Usage(gpus_held=4, gpu_hours=100.0)}, now=NOW)
    assert started(p) == ["high"]
    assert p.reasons["low"] == "waiting for 4 GPUs, 0 free"
    assert p.order == ["high", "low"]


def test_fair_share_fewer_gpus_held_first_then_fewer_gpu_hours_then_age():
    nodes = [node("n", [0])]
    # a holds more GPUs now: b goes first although a's job is older
    p = plan([job("a1", "a", 1, age=100), job("b1", "b", 1, age=1)], nodes,
             {"a": Usage(2, 0.0), "b": Usage(1, 50.0)}, now=NOW)
    assert started(p) == ["b1"]
    # equal GPUs held: fewer recent GPU-hours first
    p = plan([job("a1", "a", 1, age=100), job("b1", "b", 1, age=1)], nodes,
             {"a": Usage(1, 3.0), "b": Usage(1, 2.0)}, now=NOW)
    assert started(p) == ["b1"]
    # equal usage: the older job first
    p = plan([job("a1", "a", 1, age=100), job("b1", "b", 1, age=1)], nodes,
             {"a": Usage(1, 2.0), "b": Usage(1, 2.0)}, now=NOW)
    assert started(p) == ["a1"]


def test_fair_share_interleaves_users_as_their_usage_grows_within_one_plan():
    # a queued 6 jobs long before b queued 6: a pure age order would give a all 8 GPUs.
    jobs = [job(f"a{i}", "a", 1, age=200 - i) for i in range(6)]
    jobs += [job(f"b{i}", "b", 1, age=10 - i) for i in range(6)]
    p = plan(jobs, [node("n", range(8))], {}, now=NOW)
    got = started(p)
    assert len(got) == 8
    assert sum(j.startswith("a") for j in got) == 4 and sum(j.startswith("b") for j in got) == 4
    # and each user's own jobs go oldest first
    assert [j for j in got if j.startswith("a")] == ["a0", "a1", "a2", "a3"]
    assert p.order[:2] == ["a0", "b0"]


def test_own_jobs_by_priority_then_age():
    p = plan([job("old", "a", 1, age=90), job("urgent", "a", 1, prio=70, age=1),
              job("older", "a", 1, age=100)], [node("n", [0])], {}, now=NOW)
    assert p.order == ["urgent", "older", "old"]


# ---- reasons ----------------------------------------------------------------------------

def test_waiting_reason_quotes_free_gpus_after_this_plan():
    # 2 free; the 4-GPU job waits, the 1-GPU job behind it backfills one of the two.
    p = plan([job("big", "a", 4, age=50), job("small", "b", 1, age=10)],
             [node("n", [6, 7])], {}, now=NOW)
    assert started(p) == ["small"]
    assert p.reasons["big"] == "waiting for 4 GPUs, 1 free"
    p = plan([job("big", "a", 4)], [node("n", [6, 7])], {}, now=NOW)
    assert p.reasons["big"] == "waiting for 4 GPUs, 2 free"


def test_waiting_reason_on_several_nodes_names_the_emptiest():
    p = plan([job("big", "a", 4)], [node("x", [0, 1, 2]), node("y", [5, 6])], {}, now=NOW)
    assert p.reasons["big"] == ("waiting for 4 GPUs on one node, 3 free on the emptiest "
                                "(5 free in all)")


def test_quota_reason_and_other_users_unaffected():
    p = plan([job("a2", "a", 2, age=100), job("b4", "b", 4, age=1)], [node("n", range(8))],
             {"a": Usage(gpus_held=3)}, now=NOW, quota=4)
    assert started(p) == ["b4"]
    assert p.reasons["a2"] == "user quota 4 GPUs reached (3 held)"
    # what a plan starts counts against the quota too
    p = plan([job(f"a{i}", "a", 2, age=10 - i) for i in range(3)], [node("n", range(8))], {},
             now=NOW, quota=4)
    assert started(p) == ["a0", "a1"]
    assert p.reasons["a2"] == "user quota 4 GPUs reached (4 held)"


def test_held_cpu_and_too_big_reasons():
    p = plan([job("h", "a", 1, held=True), job("c1", "a", 0), job("c2", "b", 0),
              job("huge", "b", 16)], [node("n", range(8)), node("m", range(8))], {},
             now=NOW, cpu_free=1)
    assert sorted(started(p)) == ["c1"] or sorted(started(p)) == ["c2"]
    assert p.reasons["h"] == "held by its owner or an admin"
    assert "waiting for a CPU slot (all busy)" in p.reasons.values()
    assert p.reasons["huge"] == "needs 16 GPUs on one node; the largest schedulable node has 8"
    p = plan([job("g", "a", 1)], [node("n", range(8), ok=False)], {}, now=NOW)
    assert p.reasons["g"] == "no schedulable node with GPUs is registered"


# ---- placement --------------------------------------------------------------------------

def test_best_fit_keeps_the_emptier_node_whole():
    nodes = [node("full", range(8)), node("half", [4, 5, 6, 7]), node("drained", [0, 1], ok=False)]
    p = plan([job("j2", "a", 2, age=3), job("j8", "b", 8, age=2)], nodes, {}, now=NOW)
    assert ("j2", "half", [4, 5]) in p.dispatch
    assert ("j8", "full", list(range(8))) in p.dispatch


def test_drained_node_gets_nothing():
    p = plan([job("j", "a", 1)], [node("d", range(8), ok=False), node("live", [3])], {}, now=NOW)
    assert p.dispatch == [("j", "live", [3])]


# ---- backfill and aging -----------------------------------------------------------------

def test_small_jobs_pass_a_big_one_before_the_bound():
    p = plan([job("big", "a", 8, age=100), job("s1", "b", 2, age=50), job("s2", "c", 2, age=40)],
             [node("n", range(4))], {}, now=NOW, backfill_bound_s=300)
    assert started(p) == ["s1", "s2"]
    assert p.reasons["big"] == "waiting for 8 GPUs, 0 free"


def test_aged_big_job_holds_a_node_back_but_other_nodes_keep_working():
    nodes = [node("x", range(5)), node("y", range(2))]
    p = plan([job("big", "a", 8, age=301), job("s1", "b", 2, age=50), job("s2", "c", 2, age=40)],
             nodes, {"b": Usage(2, 10.0), "c": Usage(2, 20.0)}, now=NOW, backfill_bound_s=300)
    # big (aged, fits nowhere) is considered at a's turn, first; x (5 free) is held for it
    assert p.order[0] == "big"
    assert p.reserved == {"x": "big"}
    assert p.dispatch == [("s1", "y", [0, 1])]
    assert p.reasons["s2"] == "GPUs held back for big, waiting longer than 300s"
    assert p.reasons["big"] == "waiting for 8 GPUs, 5 free; waited over 300s, so x is held for it"


def test_aged_big_job_passes_its_owners_small_jobs_not_lighter_users():
    """Aging protects a big job from being passed by the jobs after it (its owner's own
    smaller ones too), not from fair share: a heavy user's aged job waits for lighter users'
    jobs, then holds a node that its owner's small jobs may not take."""
    nodes = [node("x", range(5)), node("y", range(2))]
    jobs = [job("big", "a", 8, age=301), job("a_small", "a", 2, age=400),
            job("s1", "b", 2, age=50), job("s2", "c", 2, age=40)]
    p = plan(jobs, nodes, {"a": Usage(8, 10.0)}, now=NOW, backfill_bound_s=300)
    assert p.order == ["s1", "s2", "big", "a_small"]
    assert p.dispatch == [("s1", "y", [0, 1]), ("s2", "x", [0, 1])]
    assert p.reserved == {"x": "big"}
    assert p.reasons["a_small"] == "GPUs held back for big, waiting longer than 300s"


def test_an_aged_job_that_fits_keeps_its_fair_share_place():
    """Aging once put every job older than the bound first, oldest first, whatever its
    owner's usage, so a backlog older than the bound was served first come, first served
    (tests/scheduler/test_fairness_sim.py). A job that fits is not promoted: the lighter
    user's fresh job goes first, and nothing is held back."""
    jobs = [job("a_old", "a", 1, age=5000), job("b_new", "b", 1, age=1)]
    p = plan(jobs, [node("n", [0])], {"a": Usage(4, 30.0)}, now=NOW, backfill_bound_s=300)
    assert started(p) == ["b_new"]
    assert p.reserved == {}


def test_aged_job_does_not_pass_higher_priority():
    p = plan([job("big", "a", 8, age=10_000), job("vip", "b", 2, prio=90)],
             [node("x", range(4))], {}, now=NOW, backfill_bound_s=300)
    assert started(p) == ["vip"]


def _simulate(jobs: list[tuple[float, str, int, float]], nodes: dict[str, int], *,
              bound: float, step: float = 1.0, quota: int = 0, fifo: bool = False):
    """Discrete-time cluster: jobs (submit_t, owner, gpus, duration) arrive, plans run every
    `step` seconds, GPUs come back when a job's duration is over. Returns, per job id
    `j<index>`, (start, end, node, GPU indices). `fifo`: the plan sees a single owner, so
    fair share plays no part (the control of the fairness test)."""
    pending = sorted(enumerate(jobs), key=lambda x: x[1][0])
    waiting: dict[str, Waiting] = {}
    running: dict[str, tuple[float, str, list[int]]] = {}
    free = {n: set(range(c)) for n, c in nodes.items()}
    hours: dict[str, float] = {}
    result: dict[str, tuple[float, float, str, list[int]]] = {}
    t = 0.0
    while pending or waiting or running:
        for jid, (end, nd, idx) in list(running.items()):
            if end <= t:
                free[nd] |= set(idx)
                del running[jid]
        while pending and pending[0][1][0] <= t:
            i, (sub, owner, g, dur) = pending.pop(0)
            waiting[f"j{i}"] = Waiting(f"j{i}", "all" if fifo else owner, 50, g, sub)
        usage: dict[str, Usage] = {}
        for jid, (_, nd, idx) in running.items():
            o = jobs[int(jid[1:])][1]
            usage.setdefault(o, Usage()).gpus_held += len(idx)
        for o, h in hours.items():
            usage.setdefault(o, Usage()).gpu_hours = h
        p = plan(list(waiting.values()), [NodeState(n, sorted(f), nodes[n]) for n, f in free.items()],
                 usage, now=t, backfill_bound_s=bound, quota=quota)
        for jid, nd, idx in p.dispatch:
            assert set(idx) <= free[nd], "a GPU handed out twice"
            free[nd] -= set(idx)
            del waiting[jid]
            dur = jobs[int(jid[1:])][3]
            running[jid] = (t + dur, nd, idx)
            result[jid] = (t, t + dur, nd, idx)
        for jid, (_, nd, idx) in running.items():
            o = jobs[int(jid[1:])][1]
            hours[o] = hours.get(o, 0.0) + len(idx) * step / 3600
        t += step
        assert t < 100_000, "simulation did not drain"
    return result


def test_no_starvation_big_job_starts_within_bound_plus_longest_running_job():
    # A stream of 1-2 GPU jobs from three users keeps one 8-GPU node busy forever after;
    # user d's 8-GPU job arrives at t=5. Without aging it would never find 8 free GPUs.
    rng = random.Random(7)
    jobs = [(5.0, "d", 8, 20.0)]
    for k in range(300):  # ~15 GPU-seconds asked per second, 8 on offer: always contended
        jobs.append((k * 1.0, "abc"[k % 3], rng.choice([1, 2]), float(rng.randint(5, 15))))
    bound = 60.0
    res = _simulate(jobs, {"n": 8}, bound=bound)
    start = res["j0"][0]
    assert 5.0 + bound < start <= 5.0 + bound + 15.0 + 1.0, start
    # and without the bound (infinite) it waits until the stream dries up
    res_inf = _simulate(jobs, {"n": 8}, bound=1e9)
    assert res_inf["j0"][0] > 300, res_inf["j0"][0]


def _contended_shares(jobs, res) -> dict[str, float]:
    """Each owner's share of the GPU-seconds until the first owner has nothing left to start
    (the definition of tests/service/test_scheduling.py)."""
    owners = sorted({j[1] for j in jobs})
    t1 = min(max(s for jid, (s, *_r) in res.items() if jobs[int(jid[1:])][1] == o)
             for o in owners)
    share = {o: 0.0 for o in owners}
    for jid, (s, e, _, idx) in res.items():
        share[jobs[int(jid[1:])][1]] += len(idx) * max(0.0, min(e, t1) - s)
    total = sum(share.values())
    return {o: v / total for o, v in share.items()}


def test_equal_demand_gets_equal_gpu_time_while_contended_and_fifo_would_not():
    """4 users, the same mix of 1-8 GPU jobs each, all queued at t=0 on two 8-GPU nodes, user
    a's first (a burst): while every user still has work queued, each user's GPU-seconds are
    within 15% (relative) of a quarter. The control: first-come-first-served (the same
    plans with fair share switched off) gives user a most of that period."""
    rng = random.Random(3)
    jobs = []
    for owner in "abcd":
        sizes = [1 + (i % 8) for i in range(24)]
        rng.shuffle(sizes)
        jobs += [(-1.0 + len(jobs) * 1e-3, owner, g, 10.0) for g in sizes]  # a's first
    fair = _contended_shares(jobs, _simulate(jobs, {"x": 8, "y": 8}, bound=1e9))
    for o, share in fair.items():
        assert abs(share - 0.25) <= 0.25 * 0.15, (o, fair)
    fifo = _contended_shares(jobs, _simulate(jobs, {"x": 8, "y": 8}, bound=1e9, fifo=True))
    assert fifo["a"] > 0.8, fifo


# ---- invariants over random cases -------------------------------------------------------

@st.composite
def _cases(draw):
    nodes = []
    for k in range(draw(st.integers(1, 4))):
        total = draw(st.integers(1, 8))
        free = draw(st.lists(st.integers(0, total - 1), unique=True, max_size=total))
        nodes.append(node(f"n{k}", free, total, ok=draw(st.booleans()) or k == 0))
    owners = ["a", "b", "c"]
    jobs = [job(f"j{i}", draw(st.sampled_from(owners)), draw(st.integers(0, 9)),
                prio=draw(st.sampled_from([10, 50, 90])), age=draw(st.floats(0, 1000)),
                held=draw(st.booleans()) and draw(st.booleans()))
            for i in range(draw(st.integers(0, 30)))]
    usage = {o: Usage(draw(st.integers(0, 6)), draw(st.floats(0, 5))) for o in owners}
    return (nodes, jobs, usage, draw(st.sampled_from([0, 4, 6])), draw(st.integers(0, 3)),
            draw(st.sampled_from([None, 0, 3])))


# derandomize: the same 600 cases on every run, so CI is reproducible (about 5 s). A random
# search (max_examples=5000, not derandomized) found the case of
# test_a_cpu_job_waiting_for_a_slot_does_not_hold_back_its_owners_aged_gpu_job below in every
# run before its fix, and none in 45,000 cases after it.
@settings(max_examples=600, deadline=None, derandomize=True, database=None)
@given(_cases())
def test_never_oversubscribes_and_respects_every_rule(case):
    nodes, jobs, usage, quota, cpu, top = case
    p = plan(jobs, nodes, usage, now=NOW, quota=quota, backfill_bound_s=500, cpu_free=cpu,
             top=top)
    by_id = {j.id: j for j in jobs}
    free = {nd.name: set(nd.free) for nd in nodes if nd.schedulable}
    held = {o: u.gpus_held for o, u in usage.items()}
    used: set[tuple[str, int]] = set()
    cpu_used = 0
    for jid, nd, idx in p.dispatch:
        j = by_id[jid]
        assert not j.held
        if j.gpus == 0:
            assert nd is None and idx == []
            cpu_used += 1
            continue
        assert nd in free and len(idx) == j.gpus and set(idx) <= free[nd]
        assert not {(nd, i) for i in idx} & used, "GPU handed out twice"
        used |= {(nd, i) for i in idx}
        held[j.owner] = held.get(j.owner, 0) + j.gpus
        assert not quota or held[j.owner] <= quota
        if nd in p.reserved:  # reserved only after this job started, never before
            assert p.order.index(jid) < p.order.index(p.reserved[nd])
    assert cpu_used <= cpu
    assert len({j for j, _, _ in p.dispatch}) == len(p.dispatch)
    # every job considered and not started has a reason
    started_ = {j for j, _, _ in p.dispatch}
    assert all(p.reasons.get(j) for j in p.order if j not in started_)
    if top is None:
        assert sorted(p.order) == sorted(by_id)
    # nothing that could start was left behind by the `top` shortcut
    full = plan(jobs, nodes, usage, now=NOW, quota=quota, backfill_bound_s=500, cpu_free=cpu)
    assert p.dispatch == full.dispatch
    # the database's order (presorted) gives the same plan as sorting here
    pre = plan(sorted(jobs, key=job_order), nodes, usage, now=NOW, quota=quota,
               backfill_bound_s=500, cpu_free=cpu, presorted=True)
    assert (pre.dispatch, pre.order, pre.reasons) == (full.dispatch, full.order, full.reasons)
    # and the jobs that could matter (what a placement-only decision reads) place the same
    most = max((len(nd.free) for nd in nodes if nd.schedulable), default=0)
    few = [j for j in jobs if could_matter(j, most, cpu, NOW, 500)]
    part = plan(few, nodes, usage, now=NOW, quota=quota, backfill_bound_s=500, cpu_free=cpu,
                top=0)
    assert part.dispatch == full.dispatch
    # and so do each owner's first fit_counts[g] g-GPU jobs (what PostgreSQL reads)
    fewer = few_that_matter(sorted(jobs, key=job_order), nodes, cpu, NOW, 500)
    assert {j.id for j in fewer} <= {j.id for j in few}
    least = plan(fewer, nodes, usage, now=NOW, quota=quota, backfill_bound_s=500,
                 cpu_free=cpu, top=0, presorted=True)
    assert least.dispatch == full.dispatch


def test_one_user_cannot_take_every_cpu_slot_while_another_waits():
    """Two long probes of one user held every CPU slot and ingests starved. While
    another user's CPU job waits, a user holds at most all the slots but one."""
    p = plan([job("a2", "a", 0, age=100), job("b1", "b", 0, age=1)], [],
             {"a": Usage(cpu_held=1)}, now=NOW, cpu_free=1)
    assert started(p) == ["b1"]
    assert "user CPU slot limit 1 reached" in p.reasons["a2"]
    # alone, a user may use every slot; an explicit bound applies the same way
    p = plan([job("a2", "a", 0)], [], {"a": Usage(cpu_held=1)}, now=NOW, cpu_free=1)
    assert started(p) == ["a2"]
    p = plan([job("a3", "a", 0, age=9), job("b1", "b", 0)], [], {"a": Usage(cpu_held=2)},
             now=NOW, cpu_free=2, user_cpu_slots=3)
    assert sorted(started(p)) == ["a3", "b1"]


@pytest.mark.parametrize("b_heavier", [True, False])
def test_a_cpu_job_waiting_for_a_slot_does_not_hold_back_its_owners_aged_gpu_job(b_heavier):
    """Regression (found by the property above with a random search): b's oldest job is a CPU
    job and no CPU slot is free; b's aged GPU job came behind it in b's own queue, so b was
    keyed by the CPU job, not the aged one, and the placement-only read (which leaves the CPU
    job out: it cannot start) placed another job than the full plan. Each user's CPU and GPU
    jobs queue apart now: both plans place the same job, by fair share (the aged job fits, so
    it is not promoted), whichever user is the heavier."""
    jobs = [job("b_cpu", "b", 0, age=700), job("b_aged", "b", 1, age=600),
            job("a_new", "a", 1, age=1)]
    nodes = [node("n0", [0], total=1)]
    usage = {"b" if b_heavier else "a": Usage(gpu_hours=1.0)}
    full = plan(jobs, nodes, usage, now=NOW, backfill_bound_s=500, cpu_free=0)
    assert full.dispatch == [("a_new" if b_heavier else "b_aged", "n0", [0])]
    assert full.reasons["b_cpu"] == "waiting for a CPU slot (all busy)"
    few = [j for j in jobs if could_matter(j, 1, 0, NOW, 500)]
    assert [j.id for j in few] == ["b_aged", "a_new"]
    part = plan(few, nodes, usage, now=NOW, backfill_bound_s=500, cpu_free=0, top=0)
    assert part.dispatch == full.dispatch
