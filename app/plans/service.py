"""Plans: dry-run a run's body on a sample of its dataset before any GPU hour is spent.

The checks need the tokenizer and the chat template, which live in the stage core, so the
API runs the `plan` stage as a short child process (`python -m workers.stages plan`) rather
than importing it (app/ never imports torch, transformers or workers/)."""

from __future__ import annotations

import fcntl
import json
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
from app.jobs.inputs import Unresolved, resolve_ref, target_dict
from app.models import Target
from app.plans.nodes import gpu_node_warnings
from app.plans.params import name_params
from contracts.run import RunSpec
from contracts.spec import StageSpec

REPO_ROOT = Path(__file__).resolve().parents[2]


def _plan_inputs(body: RunSpec) -> tuple[dict, dict | None]:
    """The target and dataset as the plan stage reads them, in a short read-only transaction
    of its own: the plan then runs for up to 120 s holding no transaction (in embedded mode
    a request's transaction would hold SQLite's write lock all that time, issue #14)."""
    with unit_of_work(read_only=True) as session:
        t = session.get(Target, body.target_id)
        if t is None:
            raise Invalid(f"target_id: {body.target_id} not found", param="target_id",
                          code="unknown_input")
        try:
            dataset = resolve_ref(session, body.dataset_id, ("dataset",))
        except Unresolved:
            dataset = None
        return target_dict(t), dataset


def make_plan(body: RunSpec, free_bytes_override: int | None = None) -> dict:
    s = get_settings()
    target, dataset = _plan_inputs(body)
    with plan_slot(s.home / "plans", s.max_concurrent_plans):
        plan = _run_plan(s, target, dataset, body, free_bytes_override)
    plan.setdefault("warnings", []).extend(gpu_node_warnings(body))
    return name_params(plan, body)


@contextmanager
def plan_slot(folder: Path, slots: int) -> Iterator[None]:
    """One of `slots` plan slots, or a 429: each plan is a child process of up to 120 s, and
    an unbounded number of them took the API's machine (issue 17 item 5). The slots are
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


def _run_plan(s, target: dict, dataset: dict | None, body: RunSpec,
              free_bytes_override: int | None) -> dict:
    work = s.home / "plans" / uuid.uuid4().hex[:12]
    work.mkdir(parents=True, exist_ok=True)
    spec = StageSpec.in_folder("plan", work, work, inputs={"target": target, "dataset": dataset},
                               params={"run": body.model_dump(mode="json"),
                                       "sample": body.plan_sample,
                                       "disk_path": str(s.artifacts_dir),
                                       "free_bytes_override": free_bytes_override,
                                       "rates": s.plan_rates})
    spec.write(work / "spec.json")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "CUDA_VISIBLE_DEVICES": ""}
    try:
        proc = subprocess.run([sys.executable, "-m", "workers.stages", "plan", "--spec",
                               str(work / "spec.json")], capture_output=True, text=True,
                              timeout=120, env=env, cwd=str(work))
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
            raise Unavailable("the plan could not run: " + (proc.stderr or "")[-500:],
                              code="plan_failed")
        return result
    except subprocess.TimeoutExpired as e:
        raise Unavailable("the plan took longer than 120 s", code="plan_timeout") from e
    finally:
        shutil.rmtree(work, ignore_errors=True)


def plan_or_refuse(body: RunSpec) -> dict:
    """The plan of a run; a plan with errors refuses the run (422) unless `force_plan`."""
    plan = make_plan(body)
    if not plan["ok"] and not body.force_plan:
        bad = [c for c in plan["checks"] if not c["ok"]]
        raise Invalid("the run's plan has errors: " + "; ".join(c["message"] for c in bad) +
                      " (set force_plan to start anyway)", code="plan_failed",
                      param=bad[0].get("param") or "body", details=plan)
    return plan
