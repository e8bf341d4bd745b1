"""Preemption end to end: two users, one node declaring 2 GPUs. A low-priority
train run holds both; a higher-priority job arrives and starts within START_BOUND_S; the
train job checkpoints on SIGTERM, is requeued (same job, attempt 2, a `preempted` event
naming the job that took its GPUs), resumes from its checkpoint and ends with the step
count of an uninterrupted run (max_steps, every step trained exactly once)."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import REDIS_DBS, wait_for
from tests.service.receiver import Receiver
from tests.service.stack import Stack, running
from tests.stages.conftest import shared_fixtures
from tests.tiny import counting_records, write_jsonl

# Submit -> running for the urgent job: the scheduler's once-a-second pass that sees it,
# the supervisor's poll (0.25 s), the train step in flight and its checkpoint, the stage's
# exit and the dispatch. About 3-6 s on an idle machine; bounded with room for a shared CI.
START_BOUND_S = 30.0
STEPS = 16


@pytest.fixture
def stack():
    def roots(st: Stack) -> None:
        st.env["DRAFTYARD_MODEL_ROOTS"] = st.env["DRAFTYARD_DATA_ROOTS"] = str(st.home)
    with running("preempt", REDIS_DBS[1], {"DRAFTYARD_PREEMPT_GRACE_S": "60",
                                           "DRAFTYARD_WEBHOOK_BACKOFF_S": "0.5",
                                           "DRAFTYARD_WEBHOOK_POLL_S": "0.2"},
                 workers={"box": "0,1"}, prepare=roots) as st:
        yield st




def _train_run(st: Stack, c) -> dict:
    """prepare -> train (online: hidden states from the HF target in-process, one stage
    process fewer than offline), 2 GPUs, priority 20, on a tiny Qwen3 target."""
    from tests.tiny import tiny_model

    d = tiny_model(st.home / "models" / "tiny", arch="qwen3")
    tmpl = (shared_fixtures() / "chat_templates" / "qwen3_6.jinja").read_text()
    target = c.post("/v1/targets", json={"name": "tiny", "path": str(d), "chat_template": tmpl})
    assert target.status_code == 201, target.text
    data = write_jsonl(st.home / "data.jsonl", counting_records(16))
    ds = c.post("/v1/datasets", json={"name": "d", "path": str(data)}).json()
    wait_for(lambda: c.get(f"/v1/datasets/{ds['id']}").json()["status"] == "ready", 120, 0.3,
             "ingest")
    body = {"name": "low", "priority": 20, "target_id": target.json()["id"], "mode": "online",
            "dataset_id": ds["id"],
            "drafter": {"type": "dflash", "num_layers": 1, "block_size": 4,
                        "draft_vocab_size": 256},
            "chat_template_kwargs": {"enable_thinking": False},
            "stages": {"generate": None, "prepare": {"seq_length": 256},
                       "extract": None,
                       # No periodic checkpoint: the one it resumes from is the SIGTERM one.
                       "train": {"max_steps": STEPS, "epochs": 100, "seq_length": 256,
                                 "checkpoint_every": 1000, "log_every": 1, "gpus": 2,
                                 "drafter": {"num_anchors": 16}},
                       "evaluate": None}}
    r = c.post("/v1/runs", json=body, timeout=180)
    assert r.status_code == 201, r.text
    return r.json()


def _grant(st: Stack, name: str, max_priority: int) -> None:
    """Priorities above the members' 50 are granted per user by an admin."""
    with st.client() as admin:
        uid = next(u["id"] for u in admin.get("/v1/users", params={"limit": 100})
                   .json()["data"] if u["name"] == name)
        r = admin.patch(f"/v1/users/{uid}", json={"max_priority": max_priority})
        assert r.status_code == 200, r.text


def _check_requeued(c, job_id: str, by: str) -> None:
    """The preempted job right after the one that took its GPUs started: queued again (same
    id, attempt 2), saying who took them and when it resumes, in its read and the queue's."""
    t = c.get(f"/v1/jobs/{job_id}").json()
    assert t["status"] == "queued" and t["attempt"] == 2, t
    p = t["preemption"]
    assert p["by"] == by and p["by_priority"] == 70 and p["count_last_hour"] == 1, p
    assert "resumes from its last checkpoint" in p["may_resume"], p
    mine = next(j for j in c.get("/v1/queue").json()["waiting"] if j["id"] == job_id)
    assert mine["preemption"]["by"] == by
    pre = [e for e in c.get(f"/v1/jobs/{job_id}/events").json()["data"]
           if e["kind"] == "preempted"]
    assert len(pre) == 1 and pre[0]["data"]["by"] == by, pre


def test_preemption_end_to_end_short(stack):
    """The preemption path of the slow test below in seconds (make test): a preemptible
    low-priority probe holds both GPUs, a priority-70 job takes them within START_BOUND_S,
    the probe's stage yields to SIGTERM, is requeued as attempt 2 and runs to the end; the
    owner hears `job.preempted` once. (Resuming from a checkpoint: the slow test.)"""
    alice, bob = stack.user("alice-s"), stack.user("bob-s")
    _grant(stack, "bob-s", 70)
    with Receiver() as rx, stack.client(alice) as a, stack.client(bob) as b:
        hook = a.post("/v1/webhooks", json={"url": rx.url, "events": ["job.preempted"]})
        assert hook.status_code == 201, hook.text
        low = a.post("/v1/jobs", json={"type": "probe", "gpus": 2, "priority": 20,
                                       "preemptible": True,
                                       "params": {"sleep_s": 6, "import_torch": False}}).json()
        wait_for(lambda: a.get(f"/v1/jobs/{low['id']}").json()["status"] == "running", 60,
                 0.1, "the low-priority probe to run")
        urgent = b.post("/v1/jobs", json={"type": "probe", "gpus": 2, "priority": 70,
                                          "params": {"sleep_s": 4, "import_torch": False}}
                        ).json()
        u = wait_for(lambda: (x := b.get(f"/v1/jobs/{urgent['id']}").json())["status"]
                     == "running" and x, START_BOUND_S, 0.1, "the urgent job to start")
        assert sorted(g["index"] for g in u["gpus_assigned"]) == [0, 1]
        _check_requeued(a, low["id"], urgent["id"])
        done = wait_for(lambda: (x := a.get(f"/v1/jobs/{low['id']}").json())["status"]
                        in ("succeeded", "failed") and x, 120, 0.3, "the probe to finish")
        assert done["status"] == "succeeded" and done["attempt"] == 2, done
        assert b.get(f"/v1/jobs/{urgent['id']}").json()["status"] == "succeeded"
        wait_for(lambda: rx.snapshot(), 30, 0.2, "the job.preempted webhook")
        (ev,) = [json.loads(r["body"]) for r in rx.snapshot()]
        assert ev["type"] == "job.preempted" and ev["data"]["job"]["id"] == low["id"]


# slow (62 s quiet, ~250 s loaded): the choice of victims is tested in tests/scheduler/test_preempt.py.
@pytest.mark.slow
def test_urgent_job_preempts_train_which_resumes_to_the_same_step_count(stack):
    alice, bob = stack.user("alice"), stack.user("bob")
    _grant(stack, "bob", 70)
    t_begin = time.time()
    with Receiver() as rx, stack.client(alice) as a, stack.client(bob) as b:
        hook = a.post("/v1/webhooks", json={"url": rx.url, "events": ["job.preempted",
                                                                 "run.succeeded"]})
        assert hook.status_code == 201, hook.text
        run = _train_run(stack, a)
        train = next(j for j in run["jobs"] if j["run_stage"] == "train")
        assert train["preemptible"] and train["priority"] == 20
        tid = train["id"]
        t_run = time.time()
        wait_for(lambda: len(a.get(f"/v1/jobs/{tid}/metrics").json().get("loss", [])) >= 3,
                 300, 0.3, "train to log a few steps")
        assert sorted(g["index"] for g in a.get(f"/v1/jobs/{tid}").json()["gpus_assigned"]) \
            == [0, 1]
        # An equal priority never preempts: a second priority-20 job just waits.
        same = b.post("/v1/jobs", json={"type": "probe", "gpus": 2, "priority": 20,
                                        "params": {}}).json()
        t0 = time.time()
        urgent = b.post("/v1/jobs", json={"type": "probe", "gpus": 2, "priority": 70,
                                          "params": {"sleep_s": 6}}).json()
        u = wait_for(lambda: (x := b.get(f"/v1/jobs/{urgent['id']}").json())["status"]
                     == "running" and x, START_BOUND_S, 0.1,
                     f"the urgent job to start within {START_BOUND_S}s")
        started_after = time.time() - t0
        print(f"urgent job started {started_after:.1f}s after submit (bound {START_BOUND_S}s)")
        assert sorted(g["index"] for g in u["gpus_assigned"]) == [0, 1]
        # The train job: requeued, same id, attempt 2, and it says why and when it resumes.
        # Queued: the urgent job holds both GPUs for its 6 s.
        _check_requeued(a, tid, urgent["id"])
        assert b.get(f"/v1/jobs/{same['id']}").json()["status"] == "queued"
        assert b.get(f"/v1/jobs/{same['id']}").json()["attempt"] == 1
        # The train job resumes (before the equal-priority probe: it queued first) and ends.
        t_steps = time.time()
        done = wait_for(lambda: (x := a.get(f"/v1/runs/{run['id']}").json())["status"]
                        in ("succeeded", "failed") and x, 400, 1, "the run to finish")
        print(f"phases: setup+ingest {t_run - t_begin:.0f}s, prepare+train to step 3 "
              f"{t0 - t_run:.0f}s, urgent start {started_after:.1f}s, resume to the end "
              f"{time.time() - t_steps:.0f}s")
        assert done["status"] == "succeeded", done
        t = a.get(f"/v1/jobs/{tid}").json()
        summary = t["metrics_summary"]
        assert t["attempt"] == 2 and summary["steps"] == STEPS == summary["total_steps"]
        stop_step = summary["resumed_from_step"]
        assert 3 <= stop_step < STEPS, summary
        steps = [s for s, _ in a.get(f"/v1/jobs/{tid}/metrics").json()["loss"]]
        assert sorted(steps) == list(range(1, STEPS + 1)), steps  # each step once
        assert b.get(f"/v1/jobs/{urgent['id']}").json()["status"] == "succeeded"
        wait_for(lambda: len(rx.snapshot()) >= 2, 30, 0.2, "the two webhooks")
        evs = {e["type"]: e for e in (json.loads(r["body"]) for r in rx.snapshot())}
        assert len(rx.snapshot()) == 2 and set(evs) == {"job.preempted", "run.succeeded"}
        assert evs["job.preempted"]["data"]["job"]["id"] == tid
        assert evs["job.preempted"]["data"]["job"]["preemption"]["by"] == urgent["id"]
        assert evs["run.succeeded"]["data"]["run"]["id"] == run["id"]


def test_preemptible_rules_per_type_and_admin_exemption(api, member):
    """train is preemptible by default and only an admin exempts one; types that do not
    resume cannot be preemptible; owners may opt in, only admins opt out."""
    r = member.post("/v1/jobs", {"type": "train", "preemptible": False, "params": {}})
    assert r.status_code == 403 and r.json()["error"]["param"] == "preemptible", r.text
    r = member.post("/v1/jobs", {"type": "prepare", "preemptible": True, "params": {}})
    assert r.status_code == 422 and r.json()["error"]["param"] == "preemptible", r.text
    job = member.submit(type="probe", params={"sleep_s": 30, "import_torch": False},
                        preemptible=True)
    plain = member.submit(type="probe", params={"import_torch": False})
    try:
        assert job["preemptible"] is True and job["preemption"] is None
        assert plain["preemptible"] is False  # the default of a type that is not train
        r = member.post(f"/v1/jobs/{job['id']}/preemptible", {"preemptible": False})
        assert r.status_code == 403, r.text
        r = api.post(f"/v1/jobs/{job['id']}/preemptible", {"preemptible": False})
        assert r.status_code == 200 and r.json()["preemptible"] is False, r.text
        assert api.job(job["id"])["preemptible"] is False
    finally:
        for j in (job, plain):
            api.post(f"/v1/jobs/{j['id']}/cancel")
