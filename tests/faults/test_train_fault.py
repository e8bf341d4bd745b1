"""The fault suite's multi-process job: a train stage with `nproc: 2` (torchrun,
DDP on gloo, one declared GPU) whose worker's whole process group is SIGKILLed mid-train.
The probes of test_faults.py are one process each; here the stage has grandchildren that live
in sessions of their own (torchrun's ranks). Checked on top of the suite's promises (ends once,
never two stage processes for one job, no lease leaked, recovery < 60 s): within 5 s of the
kill no process of the job is left (sampled from /proc by the attempt tag), and while the
restarted worker runs attempt 2 no process of attempt 1 exists.
"""

from __future__ import annotations

import json
import signal
import tempfile
import time
from pathlib import Path

import pytest

from procgroup import TAG_ENV, _environ, job_tag, tagged
from tests.faults.harness import FaultStack


def _tags(home: Path, job_id: str) -> dict[int, str]:
    """Live processes of the job, pid -> attempt tag (one that exits while we look is gone)."""
    out = {}
    for p in tagged(job_tag(str(home), job_id)):
        tag = (_environ(p) or {}).get(TAG_ENV)
        if tag is not None:
            out[p] = tag
    return out


def _train_run(fs: FaultStack) -> str:
    """prepare -> train (online: hidden states from the HF target inside each rank), the
    train stage on one declared GPU with two CPU ranks; returns the train job's id."""
    from tests.stages.conftest import shared_fixtures
    from tests.tiny import tiny_model

    home = fs.stack.home
    d = tiny_model(home / "models" / "tiny", arch="qwen3")
    tmpl = (shared_fixtures() / "chat_templates" / "qwen3_6.jinja").read_text()
    data = home / "data.jsonl"
    data.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"count to {i}"},
        {"role": "assistant", "content": " ".join(str(k) for k in range(i % 7 + 5))}]}) + "\n"
        for i in range(16)))
    with fs.client() as c:
        target = c.post("/v1/targets", json={"name": "tiny", "path": str(d),
                                             "chat_template": tmpl})
        assert target.status_code == 201, target.text
        ds = c.post("/v1/datasets", json={"name": "d", "path": str(data)}).json()
        fs.wait(lambda: c.get(f"/v1/datasets/{ds['id']}").json()["status"] == "ready", 120,
                "ingest")
        body = {"name": "fault", "target_id": target.json()["id"], "mode": "online",
                "dataset_id": ds["id"],
                "drafter": {"type": "dflash", "num_layers": 1, "block_size": 4,
                            "draft_vocab_size": 256},
                "chat_template_kwargs": {"enable_thinking": False},
                "stages": {"generate": None, "prepare": {"seq_length": 256}, "extract": None,
                           "train": {"max_steps": 24, "epochs": 100, "seq_length": 256,
                                     "checkpoint_every": 2, "log_every": 1, "gpus": 1,
                                     "nproc": 2, "drafter": {"num_anchors": 16}},
                           "evaluate": None}}
        r = c.post("/v1/runs", json=body, timeout=180)
        assert r.status_code == 201, r.text
        jobs = r.json()["jobs"]
    fs.jobs += [j["id"] for j in jobs]
    return next(j["id"] for j in jobs if j["run_stage"] == "train")


def train_worker_killed(fs: FaultStack) -> dict:
    tid = _train_run(fs)
    fs.long_jobs.append(tid)
    home = fs.stack.home
    with fs.client() as c:
        fs.wait(lambda: len(c.get(f"/v1/jobs/{tid}/metrics").json().get("loss", [])) >= 2,
                600, "train to log two steps", every=0.5)
    before = _tags(home, tid)
    assert len(before) >= 4, before  # the stage, torchrun, two ranks
    fs.worker.kill(signal.SIGKILL)  # the worker's whole process group
    t0 = time.monotonic()
    samples = []
    while (t := time.monotonic() - t0) < 5.0:
        samples.append((round(t, 2), len(_tags(home, tid))))
        time.sleep(0.1)
    left = _tags(home, tid)
    print("TRAIN-FAULT /proc samples (s since SIGKILL, processes of the job):", samples)
    assert not left, f"alive 5 s after the worker's SIGKILL: {left}; {samples}"

    fs.start_worker()  # same node: the job is requeued at registration, attempt 2 runs
    t_end = time.monotonic()
    seen: set[str] = set()
    back_s = None  # the restart until attempt 2 runs
    with fs.client() as c:
        while (j := c.get(f"/v1/jobs/{tid}").json())["status"] not in ("succeeded", "failed",
                                                                        "cancelled"):
            if back_s is None and j["status"] == "running" and j["attempt"] == 2:
                back_s = time.monotonic() - t_end
            seen |= set(_tags(home, tid).values())
            assert time.monotonic() - t_end < 600, j
            time.sleep(0.2)
    assert j["status"] == "succeeded" and j["attempt"] == 2, j
    assert seen == {job_tag(str(home), tid) + "2"}, seen
    assert j["metrics_summary"]["processes"] == 2 and j["metrics_summary"]["steps"] == 24
    assert back_s is not None
    # Recovery: attempt 2 running after the restart, and a new job then runs at once.
    rec = max(back_s, fs.canary(time.monotonic()))
    row = fs.check("worker SIGKILL mid-train nproc 2", recovery_s=rec)
    row.update(train_procs_before_kill=len(before), train_procs_after_5s=len(left),
               gone_after_s=next((t for t, n in samples if n == 0), None))
    print("FAULT-ROW", json.dumps(row))
    return row


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ingest, prepare and two training ranks twice on a shared box
def test_train_nproc2_worker_sigkilled_leaves_nothing_and_resumes_once():
    home = Path(tempfile.mkdtemp(prefix="draftyard-faults-train-"))
    fs = FaultStack(stale_s=6, home=home, settings={"DRAFTYARD_MODEL_ROOTS": str(home),
                                                    "DRAFTYARD_DATA_ROOTS": str(home)}).up()
    try:
        train_worker_killed(fs)
    finally:
        fs.close()
