"""A worker killed mid-generate, through the service: SIGKILL the worker in the middle of a
generate job; the
job is retried (the reaper requeues it onto another worker) and its output holds every input
record exactly once, the shards written before the kill kept, not redone.

The job asks for one (declared) GPU so it lands on a worker of this module: the session's
worker `w1` declares none. The two workers here are stopped and marked offline at the end.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pyarrow.parquet as pq

from tests.conftest import wait_for

N = 24


def _model_starter_of(pid: int) -> bool:
    """Is a model stage starter (workers/stages/starter.py --profile model) a child of `pid`?"""
    for d in Path("/proc").iterdir():
        try:
            if not d.name.isdigit() or int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) != pid:
                continue
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"workers.stages.starter" in argv and b"model" in argv:
            return True
    return False


def test_sigkill_worker_mid_generate_then_retry_every_record_once(api, worker, home,
                                                                 gpu_workers):
    from tests.tiny import tiny_model

    d = tiny_model(home / "models" / "tiny-genkill", arch="qwen3")
    tgt = api.post("/v1/targets", {"name": "tiny-genkill", "path": str(d)})
    assert tgt.status_code == 201, tgt.text
    records = [{"id": f"p{i:02d}", "prompt": f"Question {i}: " + "tell me more " * (i % 5)}
               for i in range(N)]
    records[5] = {"id": "p05", "messages": [  # a conversation: its assistant turns regenerate
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"}, {"role": "assistant", "content": "OK."},
        {"role": "user", "content": "and now?"}, {"role": "assistant", "content": "OK."}]}
    p = home / "data" / "genkill.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in records))
    ds = api.post("/v1/datasets", {"name": "genkill", "path": str(p)}).json()
    ds = wait_for(lambda: (x := api.get(f"/v1/datasets/{ds['id']}").json())["status"]
                  != "ingesting" and x, 120, 0.3, "ingest")
    assert ds["status"] == "ready" and ds["num_records"] == N

    gpu_workers.start("gk1")
    job = api.submit(type="generate", gpus=1, keep=True,  # its scratch (the shards) stays
                     inputs={"dataset": ds["id"], "target": tgt.json()["id"]},
                     params={"backend": "hf", "max_tokens": 40, "temperature": 0.0,
                             "batch_size": 2, "shard_records": 2,
                             "chat_template_kwargs": {"enable_thinking": False}})
    shards = home / "jobs" / job["id"] / "work" / "generate" / "shards"
    wait_for(lambda: list(shards.glob("shard-*.parquet")), 300, 0.02, "the first shard")
    gpu_workers.procs["gk1"].kill(signal.SIGKILL)  # the worker's whole process group
    j = api.job(job["id"])
    assert j["status"] == "running" and j["node"] == "gk1", j
    before = {q.name: q.read_bytes() for q in shards.glob("shard-*.parquet")}
    done_at_kill = sum(pq.read_metadata(shards / n).num_rows for n in before)
    assert 0 < done_at_kill < N, done_at_kill

    # The reaper finds gk1 lost and requeues the job (fence_s, 15 s, after gk1's last
    # heartbeat); gk2 runs attempt 2. gk2 starts its model stages' starter as it registers
    # (DRAFTYARD_STAGE_WARM_UP), so its ~5 CPU-s of imports overlap that wait instead of
    # following it (~12 s of wall on a loaded 2-core box).
    w2 = gpu_workers.start("gk2", env={"DRAFTYARD_STAGE_WARM_UP": "1"})
    wait_for(lambda: _model_starter_of(w2.pid), 30, 0.1, "gk2's model stage starter")
    # ... before attempt 2's stage asked for it: only attempt 1's stage has started yet
    starts = [e["data"]["message"] for e in
              api.get(f"/v1/jobs/{job['id']}/events?limit=1000").json()["data"]
              if e["kind"] == "log" and "stage started" in e["data"]["message"]]
    assert len(starts) == 1, starts
    j = api.wait_job(job["id"], timeout=400)
    assert j["status"] == "succeeded", j
    evs = api.get(f"/v1/jobs/{job['id']}/events?limit=1000").json()["data"]
    assert j["attempt"] == 2 and j["node"] == "gk2", [e for e in evs if e["kind"] == "status"]
    assert any("worker on node gk1 lost; requeued" in e["data"].get("reason", "")
               for e in evs if e["kind"] == "status")

    # the shards of attempt 1 were kept as they were, and not generated again
    for name, data in before.items():
        assert (shards / name).read_bytes() == data
    assert sum(pq.read_metadata(q).num_rows for q in shards.glob("shard-*.parquet")) == N
    # the stage may finish a shard in the moment between the worker's death and its own
    # (its watch on the worker): attempt 2 resumes from every whole shard, at least those
    assert done_at_kill <= j["metrics_summary"]["resumed_records"] < N

    art = api.get(f"/v1/artifacts/{j['outputs'][0]}").json()
    assert art["kind"] == "dataset" and art["meta"]["num_records"] == N, art
    rows = pq.read_table(Path(art["uri"]) / "data.parquet", columns=["id", "messages"]).to_pylist()
    ids = [r["id"] for r in rows]
    assert sorted(ids) == [r["id"] for r in records]  # every record, each exactly once
    assert ids == [r["id"] for r in records]  # in input order across the restart
    conv = next(r for r in rows if r["id"] == "p05")
    assert [m["role"] for m in conv["messages"]] == ["system", "user", "assistant", "user",
                                                    "assistant"]
    assert all(m["content"] != "OK." for m in conv["messages"] if m["role"] == "assistant")
    assert all(r["messages"][-1]["role"] == "assistant" for r in rows)
