"""Disk as a leased resource: a job that will write a known amount reserves it on
its volume when the scheduler places it, like a GPU lease, and the reservation ends with the
job's placement (its `disk_bytes` count while it is dispatched, running or cancelling). A job
whose reservation does not fit stays queued with the reason instead of starting and failing
hours later with disk_full. A per-user quota refuses new work at submit and plan time.

What is known in advance (contracts/storage.py): extract's hidden states exactly, from its
tokenized input's token count, the target's hidden size and the stored layers (the planner's
formula); prepare and generate from the estimates they state. Every stage writes into its
job's folder first (work/ and out-N/ under DRAFTYARD_HOME/jobs, the "scratch" volume) and
publishing renames that into artifacts/, so the reservation is on the scratch volume."""

from __future__ import annotations

import shutil
from collections.abc import Callable

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.core.config import get_settings
from app.core.errors import Conflict
from app.jobs.inputs import Unresolved, resolve
from app.jobs.states import LEASED
from app.models import Artifact, Job, Target
from app.storage.volumes import existing, volumes
from contracts.drafters import DEFAULT_DRAFTER, UnknownDrafter, default_layer_ids
from contracts.jobtypes import JOB_TYPES, RESERVES
from contracts.resolved import ResolvedArtifact, ResolvedTarget
from contracts.storage import (DTYPE_SIZES, generate_bytes, hidden_state_bytes, human_bytes,
                               prepare_bytes)

VOLUME = "scratch"  # where stages write (see the module doc)


def _hidden_states(session: Session, job: Job, inputs: dict) -> int | None:
    tok, tgt = inputs.get("tokenized"), inputs.get("target")
    meta = tok.meta if isinstance(tok, ResolvedArtifact) else {}
    t = session.get(Target, tgt.id) if isinstance(tgt, ResolvedTarget) and tgt.id else None
    tokens, rows = meta.get("num_tokens"), meta.get("num_rows")
    if t is None or not t.hidden_size or not isinstance(tokens, int):
        return None
    p = job.params or {}
    if p.get("max_samples") and rows:
        share = min(1.0, p["max_samples"] / rows)
        tokens, rows = int(tokens * share) + 1, min(rows, p["max_samples"])
    n_layers = t.num_layers or 1
    try:  # the stage's own default (contracts/drafters.py) when none are given
        aux = len(p["layer_ids"]) if p.get("layer_ids") else len(
            default_layer_ids(p.get("drafter_type", DEFAULT_DRAFTER), n_layers))
    except UnknownDrafter:
        return None
    return hidden_state_bytes(tokens, aux + 1, t.hidden_size,
                              DTYPE_SIZES.get(p.get("dtype", "bfloat16"), 2), rows or 0)


def _dataset(session: Session, inputs: dict) -> Artifact | None:
    ds = inputs.get("dataset")
    return session.get(Artifact, ds.id) if isinstance(ds, ResolvedArtifact) and ds.id else None


def _tokenized(session: Session, job: Job, inputs: dict) -> int | None:
    art = _dataset(session, inputs)
    return prepare_bytes(art.bytes) if art is not None else None


def _generated(session: Session, job: Job, inputs: dict) -> int | None:
    art = _dataset(session, inputs)
    if art is None:
        return None
    n = (art.meta or {}).get("num_records") or 0
    return generate_bytes(n, int((job.params or {}).get("max_tokens", 256)), art.bytes)


# What a job type reserves (contracts/jobtypes.py `disk`) -> its estimate from the job's
# inputs and params.
ESTIMATES: dict[str, Callable[[Session, Job, dict], int | None]] = {
    "hidden_states": _hidden_states, "tokenized": _tokenized, "generated": _generated}


def estimate(session: Session, job: Job) -> int | None:
    """Bytes the job will write, or None when its type states no estimate."""
    d = JOB_TYPES.get(job.type)
    if d is None or d.disk is None:
        return None
    try:
        inputs = resolve(session, job)
    except Unresolved:
        return None
    return ESTIMATES[d.disk](session, job, inputs)


class Disk:
    """One scheduling pass's view of the volumes: free bytes (statvfs, once) minus what the
    placed jobs reserve, updated as this pass places more."""

    def __init__(self, session: Session):
        self.session = session
        rows = session.execute(select(Job.disk_volume, func.sum(Job.disk_bytes)).where(
            Job.status.in_(LEASED), Job.disk_bytes.is_not(None))
            .group_by(Job.disk_volume)).all()
        self.reserved = {str(v): int(b or 0) for v, b in rows if v}
        self.free: dict[str, int] = {}
        self.margin = get_settings().disk_margin_bytes

    def _free(self, volume: str) -> int:
        if volume not in self.free:
            self.free[volume] = shutil.disk_usage(existing(volumes()[volume])).free
        return self.free[volume]

    def place(self, job: Job) -> str | None:
        """Reserve the job's bytes, or return why it must wait."""
        if job.disk_bytes is None and job.type in RESERVES:
            job.disk_bytes = estimate(self.session, job)
            job.disk_volume = VOLUME if job.disk_bytes is not None else None
        if not job.disk_bytes:
            return None
        vol = job.disk_volume or VOLUME
        left = self._free(vol) - self.reserved.get(vol, 0) - self.margin
        if job.disk_bytes > left:
            return (f"needs {human_bytes(job.disk_bytes)} on {volumes()[vol]}, "
                    f"{human_bytes(max(0, left))} free after reservations"
                    + (f" and the {human_bytes(self.margin)} margin" if self.margin else ""))
        self.reserved[vol] = self.reserved.get(vol, 0) + job.disk_bytes
        return None


# ---- quota ------------------------------------------------------------------------------

def user_bytes(session: Session, user_id: str) -> int:
    """A user's live artifact bytes plus what their placed jobs reserve."""
    arts = session.scalar(select(func.coalesce(func.sum(Artifact.bytes), 0)).where(
        Artifact.owner_id == user_id, Artifact.deleted_at.is_(None))) or 0
    res = session.scalar(select(func.coalesce(func.sum(Job.disk_bytes), 0)).where(
        Job.owner_id == user_id, Job.status.in_(LEASED))) or 0
    return int(arts) + int(res)


def check_quota(session: Session, user_id: str, user_name: str, what: str) -> None:
    """409 `storage_quota_exceeded` with the numbers when the user is at or over quota."""
    quota = get_settings().user_storage_quota_bytes
    if not quota:
        return
    used = user_bytes(session, user_id)
    if used >= quota:
        raise Conflict(f"{what} refused: {user_name} uses {human_bytes(used)} ({used} bytes) "
                       f"of storage, quota {human_bytes(quota)} ({quota} bytes); delete "
                       f"artifacts (draftyard artifacts rm ID) or ask an admin",
                       code="storage_quota_exceeded",
                       details={"used_bytes": used, "quota_bytes": quota})
