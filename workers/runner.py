"""What `run_job` does: claim, build the stage's spec, supervise it, then record the outcome
(artifacts with lineage, final status, GPUs released, dependants nudged)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
from pathlib import Path

from sqlalchemy import select

from app.core.config import get_settings
from app.core.db import unit_of_work, utcnow
from app.core.ids import new_id
from app.jobs import hooks
from app.jobs.inputs import Unresolved, resolve
from app.jobs.logs import read_tail
from app.jobs.service import add_event, cas_status, release_gpus, transition
from app.jobs.states import JobStatus as S
from app.models import Artifact, Gpu, Job
from app.scheduler.nudge import nudge
from workers.supervisor import StageOutcome, Supervisor

log = logging.getLogger("draftyard.worker")


def claim(job_id: str, node: str) -> bool:
    """dispatched -> running, once: a duplicate delivery (or a stale one for another node)
    finds nothing to claim."""
    with unit_of_work() as s:
        job = s.get(Job, job_id)
        if job is None or job.status != S.dispatched.value:
            return False
        if job.gpus_requested and job.node != node:
            return False
        now = utcnow()
        return cas_status(s, job_id, S.dispatched, S.running, started_at=now, heartbeat_at=now,
                          node=node, worker=f"{socket.gethostname()}:{os.getpid()}")


def _job_dir(job_id: str) -> Path:
    d = get_settings().jobs_dir / job_id
    d.mkdir(parents=True, exist_ok=True)
    return d


def spec_roots() -> dict[str, list[str]]:
    """The roots a stage checks its paths against again (workers/stages/common.check_roots)."""
    s = get_settings()
    return {"data": [str(p) for p in s.roots("data")] + [str(s.uploads_dir.resolve())],
            "model": [str(p) for p in s.roots("model")],
            "artifacts": [str(s.artifacts_dir.resolve())]}


def prepare_spec(job_id: str) -> tuple[Path, Path, list[int], str, int]:
    with unit_of_work() as s:
        job = s.get(Job, job_id)
        resolved = resolve(s, job)
        gpus = [g.index for g in s.scalars(select(Gpu).where(Gpu.job_id == job_id)
                                           .order_by(Gpu.index))]
        jd = _job_dir(job_id)
        out_dir = jd / f"out-{job.attempt}"
        if out_dir.exists():
            shutil.rmtree(out_dir)
        events = jd / f"events-{job.attempt}.jsonl"
        spec = {"job_id": job.id, "type": job.type, "attempt": job.attempt,
                "params": job.params, "inputs": resolved, "out_dir": str(out_dir),
                "work_dir": str(jd / "work"), "events_path": str(events),
                "gpus": gpus, "home": str(get_settings().home), "roots": spec_roots()}
        spec_path = jd / "spec.json"
        spec_path.write_text(json.dumps(spec, indent=1, default=str))
        return spec_path, events, gpus, job.type, job.attempt


def _manifest(folder: Path) -> tuple[int, list[dict]]:
    total, files = 0, []
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            size = p.stat().st_size
            total += size
            entry = {"path": str(p.relative_to(folder)), "bytes": size}
            if size <= 1 << 20:
                entry["sha256"] = hashlib.sha256(p.read_bytes()).hexdigest()
            files.append(entry)
    return total, files


def _input_ids(resolved: dict) -> list[str]:
    ids: list[str] = []
    for v in resolved.values():
        for x in (v if isinstance(v, list) else [v]):
            if isinstance(x, dict) and x.get("id"):
                ids.append(x["id"])
    return ids


def _ours(job: Job, attempt: int | None) -> bool:
    """Fence: only the attempt that still owns the job may record its end or free its GPUs
    (after a requeue the GPUs under this job id may belong to the next attempt)."""
    return attempt is None or (job.attempt == attempt and
                               job.status in (S.running.value, S.cancelling.value))


def finish(job_id: str, outcome: StageOutcome, out_dir: Path, attempt: int | None = None) -> None:
    settings = get_settings()
    with unit_of_work() as s:
        # Row lock: the reaper (SKIP LOCKED) cannot requeue the job under us meanwhile.
        job = s.get(Job, job_id, with_for_update=True)
        if outcome.lost or not _ours(job, attempt):
            log.warning("job %s attempt %s: no longer owned by this worker (now %s, attempt "
                        "%s); nothing recorded", job_id, attempt, job.status, job.attempt)
            shutil.rmtree(out_dir, ignore_errors=True)
            return
        status = S(job.status)
        if outcome.returncode == 0 and status in (S.running, S.cancelling):
            try:
                resolved = resolve(s, job)
            except Unresolved:
                resolved = {}
            out_ids = []
            for a in outcome.artifacts:
                src = out_dir / a["path"]
                if not src.exists():
                    transition(s, job, S.failed, error={
                        "code": "artifact_missing",
                        "message": f"the stage declared artifact {a['path']!r} but did not write it"})
                    release_gpus(s, job_id)
                    return
                art_id = new_id("art")
                dest = settings.artifacts_dir / a["kind"] / art_id
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dest)  # atomic: the artifact appears whole or not at all
                size, files = _manifest(dest)
                meta = {**(a.get("meta") or {}), "name": a.get("name")}
                if isinstance(meta.get("vllm_serve_command"), str):
                    # The stage cannot know where its artifact will live; now we do.
                    meta["vllm_serve_command"] = meta["vllm_serve_command"].replace(
                        "<drafter_path>", str(dest))
                (dest / "manifest.json").write_text(json.dumps(
                    {"id": art_id, "kind": a["kind"], "producer_job": job_id,
                     "inputs": _input_ids(resolved), "params": job.params, "bytes": size,
                     "files": files}, indent=1, default=str))
                s.add(Artifact(id=art_id, kind=a["kind"], uri=str(dest), bytes=size, files=files,
                               producer_job=job_id, inputs=_input_ids(resolved), meta=meta,
                               owner_id=job.owner_id))
                out_ids.append(art_id)
                add_event(s, job_id, "artifact", {"id": art_id, "kind": a["kind"],
                                                  "name": a.get("name"), "bytes": size})
            s.flush()
            transition(s, job, S.succeeded, outputs=out_ids,
                       metrics_summary=outcome.result or {})
        elif status == S.cancelling or (outcome.cancelled and status != S.succeeded):
            transition(s, job, S.cancelled, error={"code": "cancelled",
                                                   "message": "cancelled while running"})
        elif status == S.running:
            tail = read_tail(job_id, 40)
            if outcome.error:
                err = {"code": outcome.error.get("code", "stage_failed"),
                       "message": outcome.error.get("message", "the stage failed"),
                       "details": outcome.error.get("details"), "log_tail": tail}
            elif outcome.returncode < 0:
                import signal as _sig

                name = _sig.Signals(-outcome.returncode).name
                err = {"code": "stage_killed",
                       "message": f"the stage process was killed by {name} "
                                  f"(signal {-outcome.returncode}); see the log tail",
                       "log_tail": tail}
            else:
                err = {"code": "stage_crashed",
                       "message": f"the stage exited with status {outcome.returncode}",
                       "log_tail": tail}
            transition(s, job, S.failed, error=err)
        # else: the reaper or a cancel already moved it on; nothing to record.
        release_gpus(s, job_id)
        s.flush()
        hooks.on_finished(s, job)
    shutil.rmtree(out_dir, ignore_errors=True)


def run_job(job_id: str, node: str) -> str:
    if not claim(job_id, node):
        log.info("job %s: nothing to claim (duplicate or stale delivery)", job_id)
        return "skipped"
    out_dir = None
    attempt = None
    try:
        spec_path, events, gpus, type_, attempt = prepare_spec(job_id)
        out_dir = Path(json.loads(spec_path.read_text())["out_dir"])
        sup = Supervisor(job_id, type_, spec_path, spec_path.parent, events, gpus, attempt)
        sup.start()
        outcome = sup.watch()
        finish(job_id, outcome, out_dir, attempt)
    except Exception as e:  # noqa: BLE001  infrastructure failure: record it, never hang
        log.exception("job %s failed in the worker", job_id)
        with unit_of_work() as s:
            job = s.get(Job, job_id, with_for_update=True)
            if attempt is None or _ours(job, attempt):
                if job.status in (S.running.value, S.cancelling.value):
                    transition(s, job, S.failed, error={"code": "worker_error",
                                                        "message": f"{type(e).__name__}: {e}"})
                release_gpus(s, job_id)
                hooks.on_finished(s, job)
    nudge()
    return "done"
