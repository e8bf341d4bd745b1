"""Two worker machines (network namespaces a and b, tests/machines/netns.py) on one
database, one broker and one shared folder, each with node-local scratch the other cannot see.
a is the GPU box (`--gpus 0`, DRAFTYARD_CPU_SLOTS=0: GPU stages only), b the CPU box.

- short (`make test`): a GPU probe runs on a, a CPU probe on b, each attempt's scratch on its
  own machine only; a file in b's scratch is not there on a.
- slow: a whole run (ingest, generate, prepare, extract, train, evaluate on the tiny target)
  whose train runs on a and the rest on b, artifacts passing through the shared folder; the
  run report's lineage names the node of each stage."""

from __future__ import annotations

import json
import subprocess
import threading

import pytest

from tests.faults.harness import FaultStack, lease_problems
from tests.machines.netns import Machines

TERMINAL = ("succeeded", "failed", "cancelled")
_wait = FaultStack.wait


def _start(m: Machines) -> None:
    m.start_worker("a", "0", env={"DRAFTYARD_CPU_SLOTS": "0"})
    m.start_worker("b", None)
    m.stack.wait_nodes(["a", "b"])


class ScratchWatch:
    """Which attempt folders (`<job>-<attempt>`) appeared in each machine's scratch."""

    def __init__(self, m: Machines):
        self.m = m
        self.seen: dict[str, set[str]] = {k: set() for k in m.scratch}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for k, d in self.m.scratch.items():
                self.seen[k] |= {p.name.rsplit("-", 1)[0] for p in d.iterdir()}
            self._stop.wait(0.1)

    def stop(self) -> dict[str, set[str]]:
        self._stop.set()
        self._t.join(5)
        return self.seen


def _hidden_from_a(m: Machines) -> bool:
    """A file in b's scratch, looked for from inside a's worker's mount namespace."""
    f = m.scratch["b"] / "only-on-b"
    f.write_text("b")
    try:
        r = subprocess.run(["nsenter", "-t", str(m.workers["a"].pid), "-m", "test", "-e",
                            str(f)])
        return r.returncode != 0 and f.exists()
    finally:
        f.unlink()


def test_two_machines_place_and_keep_scratch_local(machines: Machines):
    m = machines
    _start(m)
    assert _hidden_from_a(m)
    watch = ScratchWatch(m)
    with m.client() as c:
        ids = {g: c.post("/v1/jobs", json={"type": "probe", "gpus": g, "params": {
            "sleep_s": 2, "steps": 4, "import_torch": False}}).json()["id"] for g in (1, 0)}
        done = {g: _wait(lambda j=j: (x := c.get(f"/v1/jobs/{j}").json())["status"] in TERMINAL
                         and x, 90, f"probe {j}") for g, j in ids.items()}
    seen = watch.stop()
    assert done[1]["status"] == "succeeded" and done[1]["node"] == "a", done[1]
    assert done[0]["status"] == "succeeded" and done[0]["node"] == "b", done[0]
    assert seen == {"a": {ids[1]}, "b": {ids[0]}}, seen
    left = [p for d in m.scratch.values() for p in d.iterdir()]
    assert not left, f"an attempt's scratch stayed: {left}"
    assert not lease_problems(m.stack.engine())


@pytest.mark.slow
@pytest.mark.timeout(1800)  # six stages on a loaded 2-core box
def test_whole_run_across_two_machines(machines: Machines):
    from draftyard import Client
    from workers.stages.tinymodel import build_tiny_target

    m = machines
    _start(m)
    c = Client(m.stack.url, m.stack.token, timeout=180)
    target = c.create_target("tiny", str(build_tiny_target(m.shared / "models" / "tiny")))
    f = m.shared / "data" / "chat.jsonl"
    f.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"count to {i}"},
        {"role": "assistant", "content": " ".join(str(k) for k in range(i % 7 + 5))}]}) + "\n"
        for i in range(16)))
    watch = ScratchWatch(m)
    ds = c.wait_dataset(c.upload_dataset(f, "chat")["id"], 180)
    assert ds["status"] == "ready", ds
    body = {"name": "two-machines", "target_id": target["id"], "dataset_id": ds["id"],
            "drafter": {"type": "dflash", "num_layers": 1, "block_size": 4,
                        "draft_vocab_size": 256},
            "chat_template_kwargs": {"enable_thinking": False},
            "stages": {"generate": {"backend": "hf", "max_tokens": 8, "batch_size": 8},
                       "prepare": {"seq_length": 256},
                       "extract": {"dtype": "float32", "backend": "hf"},
                       "train": {"max_steps": 6, "seq_length": 256, "log_every": 1, "gpus": 1,
                                 "drafter": {"num_anchors": 16}},
                       "evaluate": {"num_prompts": 2, "max_new_tokens": 8}}}
    run = c.wait_run(c.create_run(body)["id"], timeout=900)
    seen = watch.stop()
    assert run["status"] == "succeeded", run
    report = c.get(f"/v1/runs/{run['id']}/report")
    nodes = {s["stage"]: s["node"] for s in report["stages"]}
    # train on the GPU box a, every other stage (split too, where the run has one) on b
    assert nodes["train"] == "a" and {v for k, v in nodes.items() if k != "train"} == {"b"}, \
        nodes
    assert {"generate", "prepare", "extract", "evaluate"} <= set(nodes), nodes
    lineage = {(x["stage"], x["node"]) for x in report["lineage"]}
    assert ("input", "b") in lineage and ("train", "a") in lineage, report["lineage"]
    assert all(x["node"] in ("a", "b") for x in report["lineage"]), report["lineage"]
    jobs = {s["stage"]: s["job_id"] for s in report["stages"]}
    assert jobs["train"] in seen["a"] and jobs["train"] not in seen["b"], seen
    assert {jobs[s] for s in ("generate", "prepare", "extract", "evaluate")} <= seen["b"], seen
    assert max(m.sampler.max_per_job.values()) == 1, m.sampler.doubles
    assert not lease_problems(m.stack.engine())
