"""GET /v1/storage: who uses the disk. Artifact bytes come from the rows (recorded when each
artifact was published, workers/publish.py), never from walking the folders; the volumes
from one statvfs each; reservations from the live jobs' `disk_bytes`."""

from __future__ import annotations

import shutil

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.core.config import get_settings
from app.jobs.states import LEASED
from app.models import Artifact, Job, Run, User
from app.storage import delete, retention
from app.storage.volumes import existing, volumes


def reserved(session: Session) -> dict[str, int]:
    """Bytes reserved per volume by jobs that hold a placement (app/storage/reserve.py)."""
    rows = session.execute(select(Job.disk_volume, func.sum(Job.disk_bytes)).where(
        Job.status.in_(LEASED), Job.disk_bytes.is_not(None)).group_by(Job.disk_volume))
    return {str(v): int(b or 0) for v, b in rows if v}


def volume_report(session: Session) -> list[dict]:
    res = reserved(session)
    out: list[dict] = []
    seen: dict[int, str] = {}
    for name, path in volumes().items():
        du = shutil.disk_usage(existing(path))
        out.append({"name": name, "path": str(path), "total_bytes": du.total,
                    "used_bytes": du.used, "free_bytes": du.free,
                    "reserved_bytes": res.get(name, 0),
                    "free_after_reservations_bytes": max(0, du.free - res.get(name, 0)),
                    "same_as": seen.get(existing(path).stat().st_dev)})
        seen.setdefault(existing(path).stat().st_dev, name)
    return out


def _names(session: Session, ids: set[str]) -> dict[str, str]:
    if not ids:
        return {}
    return dict(session.execute(select(User.id, User.name).where(User.id.in_(ids))).all())


def report(session: Session, top: int = 50) -> dict:
    live = Artifact.deleted_at.is_(None)
    total = session.execute(select(func.count(), func.coalesce(func.sum(Artifact.bytes), 0))
                            .where(live)).one()
    by_kind = [{"kind": k, "count": n, "bytes": int(b or 0)} for k, n, b in session.execute(
        select(Artifact.kind, func.count(), func.sum(Artifact.bytes)).where(live)
        .group_by(Artifact.kind).order_by(func.sum(Artifact.bytes).desc()))]
    owners = session.execute(select(Artifact.owner_id, func.count(), func.sum(Artifact.bytes))
                             .where(live).group_by(Artifact.owner_id)
                             .order_by(func.sum(Artifact.bytes).desc())).all()
    names = _names(session, {o for o, _, _ in owners if o})
    quota = get_settings().user_storage_quota_bytes
    by_owner = [{"owner": o, "name": names.get(o) if o else None, "count": n,
                 "bytes": int(b or 0), "quota_bytes": quota or None} for o, n, b in owners]
    runs = session.execute(
        select(Job.run_id, Run.name, func.count(), func.sum(Artifact.bytes))
        .join(Job, Job.id == Artifact.producer_job).join(Run, Run.id == Job.run_id)
        .where(live).group_by(Job.run_id, Run.name)
        .order_by(func.sum(Artifact.bytes).desc()).limit(top)).all()
    by_run = [{"run_id": r, "name": nm, "count": n, "bytes": int(b or 0)}
              for r, nm, n, b in runs]
    gone = session.execute(select(func.count(), func.coalesce(func.sum(Artifact.bytes_freed), 0))
                           .where(Artifact.deleted_at.is_not(None))).one()
    items = retention.plan(session)
    return {
        "artifacts": {"count": total[0], "bytes": int(total[1] or 0)},
        "by_kind": by_kind, "by_owner": by_owner, "by_run": by_run,
        "deleted": {"count": gone[0], "bytes_freed": int(gone[1] or 0)},
        "volumes": volume_report(session),
        "reclaimable": {"bytes": sum(i.bytes for i in items), "count": len(items),
                        "by_what": {w: sum(i.bytes for i in items if i.what == w)
                                    for w in ("hidden_states", "scratch")}},
        "check": dict(delete.LAST_CHECK) or None,
    }
