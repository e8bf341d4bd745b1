"""Plans: dry-run a run's body on a sample of its dataset before any GPU hour is spent.

The checks need the tokenizer and the chat template, which live in the stage core, so the
API runs the `plan` stage as a short child process rather than importing it (app/ never
imports torch, transformers or workers/): forked by a warm plan server
(workers/stages/starter.py, one per API process, started with the first plan) that has
the stage core imported already, or, when that server cannot be reached or is turned off
(DRAFTYARD_PLAN_SERVER=false), a fresh `python -m workers.stages plan`. Both run the same
code on the same spec and leave the same events."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app.core.config import get_settings
from app.core.db import unit_of_work
from app.core.errors import Invalid, TooMany, Unavailable
from app.jobs.inputs import Unresolved, resolve_ref, resolved_target
from app.models import Target
from app.plans.nodes import gpu_node_warnings
from app.plans.params import name_params
from contracts.run import RunSpec
from contracts.resolved import PlanInputs, PlanParams, ResolvedArtifact
from contracts.spec import StageSpec
from procgroup.warm import WarmStarter

REPO_ROOT = Path(__file__).resolve().parents[2]
PLAN_TIMEOUT_S = 120
log = logging.getLogger(__name__)


def _plan_inputs(body: RunSpec) -> PlanInputs:
    """The target and dataset as the plan stage reads them, in a short read-only transaction
    of its own: the plan then runs for up to 120 s holding no transaction (in embedded mode
    a request's transaction would hold SQLite's write lock all that time)."""
    with unit_of_work(read_only=True) as session:
        t = session.get(Target, body.target_id)
        if t is None:
            raise Invalid(f"target_id: {body.target_id} not found", param="target_id",
                          code="unknown_input")
        try:
            dataset = resolve_ref(session, body.dataset_id, ("dataset",))
        except Unresolved:
            dataset = None
        return PlanInputs(target=resolved_target(t),
                          dataset=dataset if isinstance(dataset, ResolvedArtifact) else None)


def make_plan(body: RunSpec, free_bytes_override: int | None = None) -> dict:
    s = get_settings()
    inputs = _plan_inputs(body)
    with plan_slot(s.home / "plans", s.max_concurrent_plans):
        plan = _run_plan(s, inputs, body, free_bytes_override)
    plan.setdefault("warnings", []).extend(gpu_node_warnings(body))
    return name_params(plan, body)


@contextmanager
def plan_slot(folder: Path, slots: int) -> Iterator[None]:
    """One of `slots` plan slots, or a 429: each plan is a child process of up to 120 s, and
    an unbounded number of them took the API's machine. The slots are
    flock()ed files, so they hold across API processes and free themselves when one dies."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(max(1, slots)):
        fh = open(folder / f"slot-{i}.lock", "a")  # noqa: SIM115  closed below
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            continue
        try:
            yield
        finally:
            fh.close()  # closing drops the lock
        return
    raise TooMany(f"{slots} plans are running already (DRAFTYARD_MAX_CONCURRENT_PLANS); "
                  "try again when one has finished", code="too_many_plans")


def _run_plan(s, inputs: PlanInputs, body: RunSpec, free_bytes_override: int | None) -> dict:
    work = s.home / "plans" / uuid.uuid4().hex[:12]
    work.mkdir(parents=True, exist_ok=True)
    params = PlanParams(run=body.model_dump(mode="json"), sample=body.plan_sample,
                        disk_path=str(s.artifacts_dir), free_bytes_override=free_bytes_override,
                        rates=s.plan_rates)
    spec = StageSpec.in_folder("plan", work, work, inputs=inputs.model_dump(mode="json"),
                               params=params.model_dump(mode="json"))
    spec.write(work / "spec.json")
    try:
        rc, stderr = _plan_process(s, work)
        result = None
        events = Path(spec.events_path or "")
        for line in events.read_text().splitlines() if events.exists() else []:
            ev = json.loads(line)
            if ev["kind"] == "result":
                result = ev["data"]
            elif ev["kind"] == "error" and result is None:
                result = {"ok": False, "checks": [{"name": "plan", "ok": False,
                                                   "message": ev["data"]["message"]}],
                          "estimates": {}, "warnings": [], "failures": []}
        if result is None:
            raise Unavailable("the plan could not run: " + stderr[-500:], code="plan_failed")
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _plan_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "CUDA_VISIBLE_DEVICES": ""}


def _timed_out() -> Unavailable:
    return Unavailable(f"the plan took longer than {PLAN_TIMEOUT_S} s", code="plan_timeout")


def _plan_process(s, work: Path) -> tuple[int, str]:
    """Run the plan of `work/spec.json`: (exit status, its stderr). Warm when it can be."""
    if s.plan_server:
        child = PLAN_SERVER.start({"stage": "plan", "spec": str(work / "spec.json"),
                                   "cwd": str(work), "timeout_s": PLAN_TIMEOUT_S})
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(PLAN_TIMEOUT_S + 30)  # the server kills it at PLAN_TIMEOUT_S
            if child.timed_out or child.returncode is None:
                raise _timed_out()
            err = work / "stderr.txt"
            return child.returncode, err.read_text(errors="replace") if err.exists() else ""
    try:
        proc = subprocess.run([sys.executable, "-m", "workers.stages", "plan", "--spec",
                               str(work / "spec.json")], capture_output=True, text=True,
                              timeout=PLAN_TIMEOUT_S, env=_plan_env(), cwd=str(work))
    except subprocess.TimeoutExpired as e:
        raise _timed_out() from e
    return proc.returncode, proc.stderr or ""


# This API process's warm plan server (workers/stages/starter.py, profile `plan`): started
# with the first plan, restarted when it has died, gone with this process (it watches it).
PLAN_SERVER = WarmStarter("plan", [sys.executable, "-m", "workers.stages.starter",
                                   "--profile", "plan"], env=_plan_env,
                          log_path=lambda: get_settings().home / "plans" / "server.log",
                          cwd=REPO_ROOT)
atexit.register(PLAN_SERVER.stop)


def plan_or_refuse(body: RunSpec) -> dict:
    """The plan of a run; a plan with errors refuses the run (422) unless `force_plan`."""
    plan = make_plan(body)
    if not plan["ok"] and not body.force_plan:
        bad = [c for c in plan["checks"] if not c["ok"]]
        raise Invalid("the run's plan has errors: " + "; ".join(c["message"] for c in bad) +
                      " (set force_plan to start anyway)", code="plan_failed",
                      param=bad[0].get("param") or "body", details=plan)
    return plan
