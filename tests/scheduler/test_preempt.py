"""The pure preemption policy (app/scheduler/preempt.py) and how a plan holds a node for the
job that preemption frees it for (app/scheduler/policy.py `held_for`)."""

from __future__ import annotations

from app.scheduler.policy import NodeState, Waiting, plan
from app.scheduler.preempt import Holder, choose, held_for

NOW = 1_000_000.0


def h(id_: str, prio: int, gpus: list[int], **kw) -> Holder:
    return Holder(id_, prio, gpus, preemptible=kw.pop("preemptible", True), **kw)


def pick(waiters, holders, free=None, totals=None, max_per_hour=2):
    free = free if free is not None else {n: 0 for n in holders}
    totals = totals or {n: 2 for n in holders}
    return [(c.waiter, c.node, c.victims) for c in
            choose(waiters, free, totals, holders, now=NOW, max_per_hour=max_per_hour)]


def test_lower_priority_preemptible_job_yields_to_a_higher_one():
    assert pick([("urgent", 90, 2)], {"n": [h("train", 20, [0, 1])]}) == \
        [("urgent", "n", ["train"])]


def test_never_for_an_equal_priority_nor_a_non_preemptible_job():
    assert pick([("same", 20, 2)], {"n": [h("train", 20, [0, 1])]}) == []
    assert pick([("urgent", 90, 2)], {"n": [h("train", 20, [0, 1], preemptible=False)]}) == []


def test_only_running_jobs_and_not_twice_at_once():
    assert pick([("u", 90, 2)], {"n": [h("t", 20, [0, 1], running=False)]}) == []
    # Already being preempted for someone: the node is busy, nothing more is asked.
    assert pick([("u", 90, 2)], {"n": [h("t", 20, [0, 1], preempt_by="other")]}) == []
    assert pick([("other", 90, 2)], {"n": [h("t", 20, [0, 1], preempt_by="other")]}) == []


def test_bounded_per_hour():
    twice = [NOW - 100, NOW - 3000]
    assert pick([("u", 90, 2)], {"n": [h("t", 20, [0, 1], history=twice)]}) == []
    # one of them is older than an hour: it may be preempted again
    once = [NOW - 100, NOW - 4000]
    assert pick([("u", 90, 2)], {"n": [h("t", 20, [0, 1], history=once)]}) == \
        [("u", "n", ["t"])]


def test_nothing_is_preempted_unless_the_waiter_then_fits():
    # 2 of 4 GPUs are held by a priority-80 job: freeing the priority-10 pair is not enough.
    holders = {"n": [h("mid", 80, [0, 1]), h("low", 10, [2])]}
    assert pick([("u", 60, 4)], holders, free={"n": 1}, totals={"n": 4}) == []
    # With the free GPU, taking `low` is enough; `mid` is left alone.
    assert pick([("u", 60, 2)], holders, free={"n": 1}, totals={"n": 4}) == \
        [("u", "n", ["low"])]


def test_fewest_gpus_taken_lowest_priority_first_one_node_per_waiter():
    holders = {"a": [h("a-big", 10, [0, 1, 2, 3])],
               "b": [h("b-1", 30, [0]), h("b-2", 20, [1]), h("b-3", 40, [2, 3])]}
    got = pick([("u1", 90, 2), ("u2", 90, 4)], holders, free={"a": 0, "b": 0},
               totals={"a": 4, "b": 4})
    # u1 needs 2: on b it costs two 1-GPU jobs (the lowest priorities), on a all four GPUs.
    assert got[0] == ("u1", "b", ["b-2", "b-1"])
    assert got[1] == ("u2", "a", ["a-big"])  # b is being freed for u1 now


def test_a_plan_holds_the_node_for_the_job_preemption_frees_it_for():
    nodes = [NodeState("n", [0], 2)]  # one GPU freed, the other victim still checkpointing
    waiting = [Waiting("small", "c", 10, 1, NOW - 1), Waiting("urgent", "b", 90, 2, NOW - 1)]
    p = plan(waiting, nodes, {}, now=NOW, held_for=held_for({"n": [h("t", 20, [1],
                                                                     preempt_by="urgent")]}))
    assert p.dispatch == []
    assert "being freed by preemption for urgent" in p.reasons["small"]
    assert "checkpointing to yield their GPUs to it" in p.reasons["urgent"]
    nodes = [NodeState("n", [0, 1], 2)]
    p = plan(waiting, nodes, {}, now=NOW, held_for={"n": "urgent"})
    assert p.dispatch[0] == ("urgent", "n", [0, 1])


def test_a_node_held_back_for_an_aged_job_is_not_preempted_for_another():
    """A node the plan holds back for an aged job (Schedule.reserved) starts nothing else, so
    preemption does not free it for another waiter; the aged job itself may preempt there."""
    holders = {"n": [h("low", 10, [0, 1])], "m": [h("low2", 10, [0, 1])]}
    got = [(c.waiter, c.node) for c in choose([("urgent", 90, 2)], {"n": 0, "m": 0},
                                              {"n": 2, "m": 2}, holders, now=NOW,
                                              max_per_hour=2, reserved={"n": "aged"})]
    assert got == [("urgent", "m")]
    assert pick([("urgent", 90, 2)], {"n": holders["n"]}) == [("urgent", "n", ["low"])]
    only_n = {"n": holders["n"]}
    assert choose([("urgent", 90, 2)], {"n": 0}, {"n": 2}, only_n, now=NOW, max_per_hour=2,
                  reserved={"n": "aged"}) == []
    assert [c.waiter for c in choose([("aged", 90, 2)], {"n": 0}, {"n": 2}, only_n, now=NOW,
                                     max_per_hour=2, reserved={"n": "aged"})] == ["aged"]
