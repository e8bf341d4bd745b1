"""Stop and retry: the stage runs as the supervisor runs it (`python -m workers.stages train
--spec ...` in its own process group); SIGTERM checkpoints at the next step and exits 130;
the retry with the same work_dir resumes from that checkpoint and finishes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.stages import train_support as ts

REPO = Path(__file__).resolve().parents[2]


def _start(spec: dict, tmp: Path, tag: str) -> subprocess.Popen:
    spec_path = tmp / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    log = open(tmp / f"{tag}.log", "wb")  # noqa: SIM115  handed to the child
    return subprocess.Popen([sys.executable, "-m", "workers.stages", "train", "--spec",
                             str(spec_path)], cwd=REPO, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for_step(spec: dict, proc: subprocess.Popen, step: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = [e["data"]["step"] for e in ts.events(spec, "metric")]
        if steps and steps[-1] >= step:
            return
        assert proc.poll() is None, "the stage exited before it was stopped"
        time.sleep(0.1)
    raise AssertionError(f"no metric for step {step} within {timeout} s")


def _checkpoint_steps(spec: dict) -> list[int]:
    d = Path(spec["work_dir"]) / "checkpoints"
    return sorted(int(p.name.split("_")[1]) for p in d.glob("step_*"))


def _interrupt(spec: dict, tmp: Path, at_step: int, sig: int) -> int:
    proc = _start(spec, tmp, "first")
    try:
        _wait_for_step(spec, proc, at_step, timeout=300)
        os.killpg(proc.pid, sig)   # as the supervisor does: the whole process group
        return proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


# slow (~50 CPU-s: two train processes): `make test` covers SIGTERM -> checkpoint -> resumed
# steps through the service (tests/service/test_runs.py, cancel during train then retry).
@pytest.mark.slow
def test_sigterm_checkpoints_and_the_retry_resumes(train_data, tmp_path):
    from speculators.model import SpeculatorModel

    target, tok, hs = train_data
    params = ts.dflash_params(max_steps=24, checkpoint_every=10, log_every=1)
    spec = ts.train_spec(tmp_path, target, tok, hs, params)

    rc = _interrupt(spec, tmp_path, at_step=13, sig=signal.SIGTERM)
    assert rc == 130, (tmp_path / "first.log").read_text()[-3000:]
    stopped = max(e["data"]["step"] for e in ts.events(spec, "metric"))
    saved = _checkpoint_steps(spec)
    # step_10 from the cadence, and the stop's own checkpoint at the step it stopped on.
    assert saved == [10, stopped] and stopped >= 13, (saved, stopped)
    assert any("stop requested" in e["data"]["message"] for e in ts.events(spec, "warning"))
    assert not (Path(spec["out_dir"]) / "drafter").exists()
    before = ts.events(spec)

    proc = _start(spec, tmp_path, "retry")
    assert proc.wait(timeout=600) == 0, (tmp_path / "retry.log").read_text()[-3000:]
    after = ts.events(spec)[len(before):]
    resumed_steps = [e["data"]["step"] for e in after if e["kind"] == "metric"]
    # The step counter continues from the checkpoint, not from 0.
    assert resumed_steps[0] == stopped + 1 and resumed_steps[-1] == 24, resumed_steps
    (result,) = [e["data"] for e in after if e["kind"] == "result"]
    assert result["steps"] == 24 and result["resumed_from_step"] == stopped
    first_loss = ts.events(spec, "metric")[0]["data"]["loss"]
    assert result["initial_loss"] == first_loss            # carried over, not re-measured
    resumed_loss = next(e["data"]["loss"] for e in after if e["kind"] == "metric")
    assert resumed_loss < 0.8 * first_loss                  # the loss continues too
    (art,) = [e["data"] for e in after if e["kind"] == "artifact"]
    assert art["kind"] == "drafter" and art["meta"]["steps"] == 24
    assert SpeculatorModel.from_pretrained(str(Path(spec["out_dir"]) / "drafter"))
    assert _checkpoint_steps(spec) == [20, 24]              # the newest two are kept


def _weights(spec: dict) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(spec["out_dir"]) / "drafter" / "model.safetensors"))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_resumed_run_equals_an_uninterrupted_one(train_data, tmp_path, sig):
    """Weights, optimizer, schedulers, RNG (DFlash anchors) and data position all resume:
    a killed-and-retried run ends with exactly the weights of an uninterrupted one. After
    SIGKILL the retry repeats the steps since the last cadence checkpoint."""
    from tests.stages.typed import run_stage
    from workers.stages.common import StageContext

    target, tok, hs = train_data
    params = ts.dflash_params(max_steps=24, checkpoint_every=8, log_every=1)
    whole = ts.train_spec(tmp_path, target, tok, hs, params, name="whole")
    ctx = StageContext.from_spec(whole)
    run_stage("train", whole, ctx)
    ctx.close()

    spec = ts.train_spec(tmp_path, target, tok, hs, params, name="cut")
    rc = _interrupt(spec, tmp_path, at_step=11, sig=sig)
    assert rc == (-signal.SIGKILL if sig == signal.SIGKILL else 130)
    assert _checkpoint_steps(spec)[0] == 8
    proc = _start(spec, tmp_path, "retry")
    assert proc.wait(timeout=600) == 0, (tmp_path / "retry.log").read_text()[-3000:]
    a, b = _weights(whole), _weights(spec)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.slow
def test_ddp_on_two_cpu_processes_stops_and_resumes(train_data, tmp_path):
    """nproc=2 without GPUs runs the torchrun + DDP path on gloo: the stage process stays
    the parent, a SIGTERM to the group stops both ranks at the same step with one collective
    checkpoint (an RNG file per rank), and the retry finishes."""
    target, tok, hs = train_data
    params = ts.dflash_params(max_steps=16, checkpoint_every=100, log_every=1, nproc=2)
    spec = ts.train_spec(tmp_path, target, tok, hs, params)
    rc = _interrupt(spec, tmp_path, at_step=4, sig=signal.SIGTERM)
    assert rc == 130, (tmp_path / "first.log").read_text()[-3000:]
    (stopped,) = _checkpoint_steps(spec)
    ckpt = Path(spec["work_dir"]) / "checkpoints" / f"step_{stopped}"
    assert {p.name for p in ckpt.glob("rng_*.pt")} == {"rng_0.pt", "rng_1.pt"}
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["world"] == 2 and state["step"] == stopped >= 4
    before = len(ts.events(spec))

    proc = _start(spec, tmp_path, "retry")
    assert proc.wait(timeout=900) == 0, (tmp_path / "retry.log").read_text()[-3000:]
    after = ts.events(spec)[before:]
    steps = [e["data"]["step"] for e in after if e["kind"] == "metric"]
    assert steps == list(range(stopped + 1, 17))     # one rank reports, no duplicates
    (result,) = [e["data"] for e in after if e["kind"] == "result"]
    assert result["processes"] == 2 and result["resumed_from_step"] == stopped
    assert result["final_loss"] < 0.8 * result["initial_loss"]
