"""Deleting artifacts to tombstones: the files go, the row stays with `deleted_at`,
who deleted it and the bytes freed, so lineage and reports still read.

Crash safety is the order, mark then remove: the tombstone commits first, and only after the
commit (`after_commit`) is the artifact's folder renamed into `<artifacts>/.trash/<id>` (one
rename: the folder is whole or gone) and unlinked there. A process killed anywhere in between
leaves either a live row whose files are all in place (killed before the commit) or a
tombstone whose files are partly still on disk (killed after it): never a live row pointing
at missing files. `check_storage()` (run at API startup) finishes the second kind and
reports any live row whose folder is missing, which this order never makes.

Never while in use: a job that is pending, queued, dispatched, running or cancelling and names
the artifact (directly, through its dataset, or as `{"job": producer}`, which is how a run's
later stages name the earlier ones) makes the delete a 409 naming those jobs."""

from __future__ import annotations

import functools
import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.auth import Principal
from app.core.config import get_settings
from app.core.db import after_commit, unit_of_work, utcnow
from app.core.errors import Conflict, Forbidden
from app.jobs.states import UNFINISHED
from app.models import Artifact, Dataset, Job
from app.scheduler.service import lock

log = logging.getLogger("draftyard.storage")
TRASH = ".trash"
RETENTION = "retention"  # deleted_by of what a retention rule removed


def _refs(value: Any, out: set[str]) -> set[str]:
    """Every id a job's inputs name: plain ids, {"job"}, {"artifact"}, {"dataset_id"}."""
    if isinstance(value, str):
        out.add(value)
    elif isinstance(value, list):
        for v in value:
            _refs(v, out)
    elif isinstance(value, dict):
        for k in ("job", "artifact", "dataset_id"):
            if isinstance(value.get(k), str):
                out.add(value[k])
    return out


def needed_by(session: Session, art_ids: Iterable[str], extra: Iterable[str] = ()) -> list[str]:
    """The live jobs that need any of `art_ids` (or name one of the ids in `extra`, e.g. the
    dataset being deleted), oldest first."""
    want = set(art_ids)
    names = set(extra)
    rows = session.execute(select(Job.id, Job.type, Job.inputs).where(Job.status.in_(UNFINISHED))
                           .order_by(Job.created_at)).all()
    refs = {r.id: _refs(list((r.inputs or {}).values()), set()) if r.type != "ingest" else set()
            for r in rows}
    named: set[str] = set().union(*refs.values()) if refs else set()
    # What each named job or dataset stands for (only the ones some live job names).
    outputs: dict[str, set[str]] = {}
    for row in session.execute(select(Job.id, Job.outputs).where(
            Job.id.in_([x for x in named if x.startswith("job_")]))):
        outputs[row.id] = {str(x) for x in (row.outputs or [])}
    ds_art: dict[str, str] = {d: a for d, a in session.execute(
        select(Dataset.id, Dataset.artifact_id).where(
            Dataset.id.in_([x for x in named if x.startswith("ds_")]))) if a}
    users = []
    for job_id, rs in refs.items():
        stands_for = set(rs)
        for x in rs:
            stands_for |= outputs.get(x, set())
            if x in ds_art:
                stands_for.add(ds_art[x])
        if stands_for & (want | names):
            users.append(job_id)
    return users


def refuse_if_needed(session: Session, what: str, art_ids: list[str],
                     extra: Iterable[str] = (), code: str = "artifact_in_use") -> None:
    users = needed_by(session, art_ids, extra)
    if users:
        shown = ", ".join(users[:10]) + (f" and {len(users) - 10} more" if len(users) > 10 else "")
        raise Conflict(f"{what} is needed by live jobs: {shown}; cancel them or wait until "
                       f"they end", code=code, details={"jobs": users})


def trash_dir() -> Path:
    return get_settings().artifacts_dir / TRASH


def remove_files(art_id: str, uri: str) -> None:
    """The removal half (after the tombstone committed): rename into the trash, unlink there.
    Idempotent, so the startup check can finish what a killed process started."""
    src, trash = Path(uri), trash_dir() / art_id
    if src.exists():
        trash.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(src, trash)
        except OSError:  # another filesystem (or trash in the way): unlink in place
            shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(trash, ignore_errors=True)


def tombstone(session: Session, art: Artifact, by: str) -> None:
    """Mark `art` deleted in this transaction; its files go once the transaction commits."""
    if art.deleted_at is not None:
        return
    art.deleted_at = utcnow()
    art.deleted_by = by
    art.bytes_freed = art.bytes
    after_commit(session, functools.partial(remove_files, art.id, art.uri))


def may_delete(user: Principal, owner_id: str | None, what: str) -> None:
    if not (user.is_admin or (owner_id is not None and owner_id == user.id)):
        raise Forbidden(f"only the owner of {what} or an admin may delete it", code="not_owner")


def delete_artifact(session: Session, user: Principal, art: Artifact) -> Artifact:
    may_delete(user, art.owner_id, art.id)
    if art.deleted_at is not None:
        return art  # idempotent: a second DELETE reads the same tombstone
    lock(session)  # the scheduler's: no pass resolves and dispatches a job on it meanwhile
    refuse_if_needed(session, f"artifact {art.id}", [art.id])
    tombstone(session, art, user.id)
    return art


def check_storage() -> dict:
    """Startup check: finish deletes a killed process left half-done (tombstones whose files
    are still there, leftovers in the trash) and report live artifact rows whose folder is
    missing. Returns {"finished": [ids], "missing": [ids]}; logs what it found."""
    finished, missing = [], []
    with unit_of_work(read_only=True) as s:
        rows = s.execute(select(Artifact.id, Artifact.uri, Artifact.deleted_at)).all()
    tomb = {r.id for r in rows if r.deleted_at is not None}
    for r in rows:
        if r.deleted_at is not None:
            if Path(r.uri).exists() or (trash_dir() / r.id).exists():
                remove_files(r.id, r.uri)
                finished.append(r.id)
        elif not Path(r.uri).exists():
            missing.append(r.id)
    if trash_dir().is_dir():
        for p in trash_dir().iterdir():
            if p.name not in tomb:  # only a tombstone's files are ever moved here
                log.warning("storage: %s in the trash has no tombstone; left in place", p)
    if finished:
        log.warning("storage: finished %d interrupted delete(s): %s", len(finished),
                    ", ".join(finished))
    if missing:
        log.error("storage: %d artifact(s) have no files but no tombstone: %s", len(missing),
                  ", ".join(missing))
    result = {"at": utcnow().isoformat(), "finished": finished, "missing": missing}
    LAST_CHECK.clear()
    LAST_CHECK.update(result)
    return result


LAST_CHECK: dict = {}
