"""What `run_job` does: claim, build the stage's spec, supervise it, then publish the
artifacts (files: workers/publish.py) and record the outcome (DB: artifact rows with lineage,
final status, GPUs released; the lifecycle subscribers do the rest)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.cluster.service import mark_offline
from app.core.config import get_settings
from app.core.db import db_now, unit_of_work
from app.jobs.inputs import InputDeleted, resolve
from app.jobs.logs import read_tail
from app.jobs.service import (
    add_event,
    requeue,
    requeue_preempted,
    retry_killed,
    transition,
)
from app.jobs.service import claim as claim_job
from app.jobs.states import JobStatus as S
from app.models import Artifact, Gpu, Job
from app.scheduler.reaper import fence_s, give_up_s
from app.storage.retention import settle_scratch
from contracts.resolved import Resolved
from contracts.spec import StageSpec
from procgroup.memory import mib
from workers.attempt import Attempt
from workers.publish import ArtifactMissing, Published, publish_artifacts, unpublish
from workers.supervisor import STOP, StageOutcome, Supervisor, retrying

log = logging.getLogger("draftyard.worker")


def claim(job_id: str, node: str) -> bool:
    """dispatched -> running, once: a duplicate delivery (or a stale one for another node)
    finds nothing to claim."""
    with unit_of_work() as s:
        return claim_job(s, job_id, node, worker=f"{socket.gethostname()}:{os.getpid()}",
                         now=db_now(s))


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


def scratch_dir(job_id: str, attempt: int) -> Path:
    """This attempt's node-local folder (DRAFTYARD_SCRATCH_DIR, else under the job's folder):
    its spec, events file and TMPDIR. Removed when the attempt ends; what a retry resumes
    from is in the job's shared `work/` (app/cluster/shared.py says what lives where)."""
    s = get_settings()
    d = (s.scratch_dir / f"{job_id}-{attempt}" if s.scratch_dir
         else s.jobs_dir / job_id / f"scratch-{attempt}")
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


def prepare_attempt(job_id: str) -> Attempt:
    """The claimed job's attempt: its inputs resolved (once), its GPUs, its spec written."""
    with unit_of_work() as s:
        job = s.get_one(Job, job_id)
        resolved = resolve(s, job)
        gpus = [g.index for g in s.scalars(select(Gpu).where(Gpu.job_id == job_id)
                                           .order_by(Gpu.index))]
        jd = _job_dir(job_id)
        scratch = scratch_dir(job_id, job.attempt)
        spec = StageSpec.in_folder(job.type, jd, scratch, attempt=job.attempt, job_id=job.id,
                                   params=job.params, inputs=_dump(resolved), gpus=gpus,
                                   roots=spec_roots(),
                                   limits={"max_decompressed_bytes":
                                           get_settings().max_decompressed_bytes})
        shutil.rmtree(spec.out_dir, ignore_errors=True)  # what a killed try left
        return Attempt(job.id, job.attempt, jd, spec, spec.write(scratch / "spec.json"),
                       _input_ids(resolved))


def _dump(resolved: dict) -> dict:
    """The resolved inputs as the spec file carries them (JSON)."""
    return {k: [x.model_dump(mode="json") for x in v] if isinstance(v, list)
            else v.model_dump(mode="json") if isinstance(v, Resolved) else v
            for k, v in resolved.items()}


def _input_ids(resolved: dict) -> list[str]:
    ids: list[str] = []
    for v in resolved.values():
        for x in (v if isinstance(v, list) else [v]):
            if isinstance(x, Resolved) and x.id:
                ids.append(x.id)
    return ids


def _ours(job: Job, attempt: int | None) -> bool:
    """Fence: only the attempt that still owns the job may record its end or free its GPUs
    (after a requeue the GPUs under this job id may belong to the next attempt)."""
    return attempt is None or (job.attempt == attempt and
                               job.status in (S.running.value, S.cancelling.value))


def finish(att: Attempt, outcome: StageOutcome) -> None:
    """Publish the attempt's artifacts (files) and record the outcome (DB), under the job's
    row lock: the reaper (SKIP LOCKED) cannot requeue the job meanwhile. All or nothing: if the
    commit fails (DB down), the artifacts that were moved go back into out_dir, so a retry
    finds them where the stage left them."""
    moved: list[tuple[Path, Path]] = []
    try:
        _finish(att, outcome, moved)
    except BaseException:
        unpublish(moved)
        raise
    shutil.rmtree(att.out_dir, ignore_errors=True)


def _finish(att: Attempt, outcome: StageOutcome, moved: list[tuple[Path, Path]]) -> None:
    with unit_of_work() as s:
        job = s.get_one(Job, att.job_id, with_for_update=True)
        if outcome.lost or not _ours(job, att.number):
            log.warning("job %s attempt %s: no longer owned by this worker (now %s, attempt "
                        "%s); nothing recorded", att.job_id, att.number, job.status,
                        job.attempt)
            return
        published: list[Published] = []
        missing = None
        if outcome.returncode == 0 and job.status in (S.running.value, S.cancelling.value):
            try:
                published = publish_artifacts(outcome.artifacts, att.out_dir,
                                              get_settings().artifacts_dir, job_id=att.job_id,
                                              inputs=att.input_ids, params=job.params,
                                              moved=moved)
            except ArtifactMissing as e:
                missing = e
        record_outcome(s, job, outcome, published, att.input_ids, missing)


def record_outcome(s: Session, job: Job, outcome: StageOutcome, published: list[Published],
                   inputs: list[str], missing: ArtifactMissing | None = None) -> None:
    """The job's end in the DB only: artifact rows, final status (which frees the GPUs). What follows
    from the status (dataset, run, scheduler) is the lifecycle subscribers' (app/wiring.py)."""
    status = S(job.status)
    if missing is not None:
        transition(s, job, S.failed, error={"code": "artifact_missing", "message": str(missing)})
    elif outcome.returncode == 0 and status in (S.running, S.cancelling):
        for p in published:
            s.add(Artifact(id=p.id, kind=p.kind, uri=p.uri, bytes=p.bytes, files=p.files,
                           producer_job=job.id, inputs=inputs, meta=p.meta,
                           owner_id=job.owner_id))
            add_event(s, job.id, "artifact", {"id": p.id, "kind": p.kind, "name": p.name,
                                              "bytes": p.bytes})
        s.flush()
        transition(s, job, S.succeeded, outputs=[p.id for p in published],
                   metrics_summary=outcome.result or {})
    elif outcome.preempted and status == S.running and not outcome.error:
        # It yielded (exit on SIGTERM, or SIGKILL after the grace): resume later. A stage
        # that reported its own error while stopping failed for that reason instead.
        requeue_preempted(s, job)
    elif outcome.stopped and status == S.running and not outcome.error:
        # Its worker was stopped: not the job's fault, so its budget of attempts stays whole;
        # the next attempt resumes from what this one saved (contracts/jobtypes.py resumable).
        # The node is offline first, so the requeue does not place the job on it again.
        if job.node:
            mark_offline(s, job.node)
        requeue(s, job, f"the worker on {job.node} stopped ({outcome.stopped}) while the "
                        f"stage ran; requeued", fault=False)
    elif status == S.cancelling or (outcome.cancelled and status != S.succeeded):
        transition(s, job, S.cancelled, error={"code": "cancelled",
                                               "message": "cancelled while running"})
    elif status == S.running:
        error = _stage_error(job.id, outcome)
        if outcome.outside_signal is None or not retry_killed(s, job, error):
            transition(s, job, S.failed, error=error)
    # else: the reaper or a cancel already moved it on; nothing to record. Each transition
    # out of running/cancelling gave the job's GPUs back.


def _stage_error(job_id: str, outcome: StageOutcome) -> dict:
    tail = read_tail(job_id, 40)
    if outcome.error:
        return {"code": outcome.error.get("code", "stage_failed"),
                "message": outcome.error.get("message", "the stage failed"),
                "details": outcome.error.get("details"), "log_tail": tail}
    if outcome.outside_signal is not None:
        return _killed_outside(outcome.outside_signal, outcome.memory or {}, tail)
    if outcome.returncode < 0:
        name = _signal_name(-outcome.returncode)
        return {"code": "stage_killed",
                "message": f"the stage process was killed by {name} "
                           f"(signal {-outcome.returncode}); see the log tail",
                "log_tail": tail}
    return {"code": "stage_crashed",
            "message": f"the stage exited with status {outcome.returncode}", "log_tail": tail}


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _killed_outside(signum: int, memory: dict, tail: str) -> dict:
    """The error of a stage that died by a signal no part of draftyard sent: the signal, what
    its processes held at their peak and what the node had, so the user can tell an
    out-of-memory kill from an operator's `kill`."""
    name = _signal_name(signum)
    oom = memory.get("oom_kills_meanwhile")
    peak = memory.get("peak_bytes")
    if signum == signal.SIGKILL and oom:
        why = ("; the kernel's out-of-memory killer killed a process on this node meanwhile "
               "(/proc/vmstat oom_kill): most likely the stage ran out of memory")
    elif signum == signal.SIGKILL:
        why = ("; a SIGKILL from outside is most often the kernel's out-of-memory killer "
               "(or a container's memory limit)")
    else:
        why = ""
    return {"code": "stage_killed",
            "message": f"the stage process was killed by {name} (signal {signum}), which no "
                       f"part of draftyard sent{why}. Peak memory of the stage's processes: "
                       f"{mib(peak)}; the node had {mib(memory.get('node_available_bytes'))} "
                       f"available of {mib(memory.get('node_total_bytes'))}",
            "details": {"signal": name, "signal_number": signum, "memory": memory},
            "log_tail": tail}


def decline(job_id: str, why: str) -> bool:
    """A job dispatched to a worker that is stopping: back to queued (its GPUs freed), for
    the scheduler to place elsewhere or once a worker is back. False: not dispatched."""
    with unit_of_work() as s:
        job = s.get(Job, job_id, with_for_update=True)
        if job is None or job.status != S.dispatched.value:
            return False
        transition(s, job, S.queued, reason=f"its worker is stopping ({why}); requeued",
                   node=None)
        return True


def run_job(job_id: str, node: str) -> str:
    if STOP.reason:  # a message taken while this worker stops: its stage would be stopped
        retrying(lambda: decline(job_id, STOP.reason or ""), f"job {job_id}: decline",
                 get_settings().stale_after_s / 2)
        return "declined"
    # A DB blip as the message arrives: retry (the reaper requeues an unclaimed dispatch).
    if not retrying(lambda: claim(job_id, node), f"job {job_id}: claim",
                    get_settings().stale_after_s / 2):
        log.info("job %s: nothing to claim (duplicate or stale delivery)", job_id)
        return "skipped"
    att: Attempt | None = None
    sup = None
    try:
        done: Attempt = retrying(lambda: prepare_attempt(job_id), f"job {job_id}: spec",
                                 give_up_s())
        att = done
        sup = Supervisor(done)
        sup.start()
        outcome = sup.watch()
        # The stage has ended and its scratch holds nothing the outcome needs: drop it before
        # the job turns terminal, so a finished job never has scratch left on its node.
        shutil.rmtree(done.scratch, ignore_errors=True)
        # The stage has ended: no process to fence, so keep trying to record its outcome
        # until the reaper would take the job anyway (then finish records nothing).
        retrying(lambda: finish(done, outcome), f"job {job_id}: finish", fence_s())
        try:  # retention (app/storage/retention.py): best effort, prune finds what is left
            settle_scratch(job_id)
        except Exception:
            log.exception("job %s: scratch not settled", job_id)
    except Exception as e:  # infrastructure failure: record it, never hang
        if sup is not None:
            sup.kill()  # nothing of this attempt may outlive its supervisor
        if att is not None:
            shutil.rmtree(att.scratch, ignore_errors=True)
        log.exception("job %s failed in the worker", job_id)
        with unit_of_work() as s:
            job = s.get_one(Job, job_id, with_for_update=True)
            if _ours(job, att.number if att is not None else None):
                if job.status in (S.running.value, S.cancelling.value):
                    err = ({"code": "input_deleted", "message": str(e)}
                           if isinstance(e, InputDeleted)
                           else {"code": "worker_error", "message": f"{type(e).__name__}: {e}"})
                    transition(s, job, S.failed, error=err)
    finally:
        if att is not None:  # the node-local scratch of this attempt (a backstop)
            shutil.rmtree(att.scratch, ignore_errors=True)
    # No explicit nudge: the final transition wakes the scheduler (app/wiring.py).
    return "done"
