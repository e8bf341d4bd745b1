"""Datasets: created by an upload or a server path (an `ingest` job), or by mixing others
(a `mix` job). The dataset row follows its job."""

from __future__ import annotations

import bz2
import errno
import gzip
import lzma
import re
import shutil
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.auth import Principal
from app.core.config import get_settings
from app.core.db import after_commit
from app.core.errors import Conflict, Invalid, NoSpace, NotFound, TooLarge
from app.core.names import check_name_free
from app.core.ids import new_id
from app.core.pagination import Page, paginate
from app.core.paths import resolve_inside
from app.jobs.lifecycle import StatusChanged
from app.jobs.schemas import JobCreate
from app.jobs.service import create_job
from app.jobs.states import TERMINAL, WAITING
from app.jobs.states import JobStatus as S
from app.models import Artifact, Dataset, Job
from app.scheduler.service import lock
from app.storage.delete import may_delete, refuse_if_needed, tombstone
from contracts.ingest import FORMAT_CHOICES
from contracts.jobtypes import JobType

SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".parquet", ".gz", ".zst")


def _check_format(fmt: str) -> str:
    if fmt not in FORMAT_CHOICES:
        raise Invalid(f"format {fmt!r} is not supported; one of: {', '.join(FORMAT_CHOICES)}",
                      param="format", code="unknown_format")
    return fmt


def _new(session: Session, user: Principal, name: str, source: dict, fmt: str | None) -> Dataset:
    check_name_free(session, Dataset, user, name)
    ds = Dataset(id=new_id("ds"), name=name, owner_id=user.id, status="ingesting",
                 source=source, format=None if fmt in (None, "auto") else fmt)
    session.add(ds)
    session.flush()
    return ds


def _start_ingest(session: Session, user: Principal, ds: Dataset, path: Path, fmt: str) -> Dataset:
    job = create_job(session, user, JobCreate(
        type=JobType.ingest, name=f"ingest {ds.name}",
        inputs={"source": {"path": str(path), "name": ds.name}},
        params={"format": fmt, "dataset_name": ds.name}))
    ds.job_id = job.id
    return ds


def from_path(session: Session, user: Principal, name: str, raw_path: str, fmt: str) -> Dataset:
    s = get_settings()
    path = resolve_inside(raw_path, s.roots("data"), what="data", param="path",
                          env="DRAFTYARD_DATA_ROOTS")
    if not path.is_file():
        raise Invalid(f"path: {raw_path} is not a file", param="path", code="not_a_file")
    ds = _new(session, user, name, {"path": str(path)}, _check_format(fmt))
    return _start_ingest(session, user, ds, path, fmt)


def from_upload(session: Session, user: Principal, name: str, filename: str | None, fileobj,
                fmt: str) -> Dataset:
    s = get_settings()
    _check_format(fmt)
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(filename or "upload.jsonl").name)[-120:]
    if not safe.endswith(SUFFIXES):
        raise Invalid(f"file {filename!r}: unsupported file type; use one of "
                      f"{', '.join(SUFFIXES[:6])}", param="file", code="unsupported_file")
    ds = _new(session, user, name, {"upload": filename}, fmt)
    dest_dir = s.uploads_dir / ds.id
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / safe
    written = 0
    try:
        with open(dest, "wb") as out:
            while chunk := fileobj.read(1 << 20):
                written += len(chunk)
                if written > s.max_upload_bytes:
                    raise TooLarge(f"upload exceeds DRAFTYARD_MAX_UPLOAD_BYTES "
                                   f"({s.max_upload_bytes} bytes)", param="file")
                out.write(chunk)
        inflated = inflated_size(dest, s.max_decompressed_bytes)
        if inflated > s.max_decompressed_bytes:
            raise TooLarge(f"file: the upload inflates past DRAFTYARD_MAX_DECOMPRESSED_BYTES "
                           f"({s.max_decompressed_bytes} bytes)", param="file",
                           code="decompressed_too_large")
    except OSError as e:
        shutil.rmtree(dest_dir, ignore_errors=True)  # nothing half-written stays behind
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise NoSpace("the server's upload storage is full; nothing was stored",
                          param="file") from e
        raise
    except BaseException:
        shutil.rmtree(dest_dir, ignore_errors=True)  # nothing half-written stays behind
        raise
    if written == 0:
        shutil.rmtree(dest_dir, ignore_errors=True)
        raise Invalid("file: the upload is empty", param="file", code="empty_file")
    return _start_ingest(session, user, ds, dest, fmt)


def _inflating_reader(path: Path) -> Any:
    """A reader of the inflated bytes of a compressed file (sniffed, as the ingest does),
    or None for a plain one."""
    with open(path, "rb") as fh:
        magic = fh.read(6)
    if magic[:2] == b"\x1f\x8b":
        return gzip.open(path, "rb")
    if magic[:4] == b"\x28\xb5\x2f\xfd":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"),
                                                          read_across_frames=True, closefd=True)
    if magic[:3] == b"BZh":
        return bz2.open(path, "rb")
    if magic[:6] == b"\xfd7zXZ\x00":
        return lzma.open(path, "rb")
    return None


def inflated_size(path: Path, cap: int) -> int:
    """Bytes a compressed file inflates to, counted as it streams and given up past `cap`
    (0 for a plain file). A corrupt stream counts what was read: the ingest reports it."""
    reader = _inflating_reader(path)
    if reader is None:
        return 0
    total = 0
    with reader:
        try:
            while total <= cap and (chunk := reader.read(1 << 20)):
                total += len(chunk)
        except (OSError, EOFError, ValueError, lzma.LZMAError):
            pass
        except Exception as e:  # zstandard.ZstdError: a corrupt stream too
            if type(e).__module__.split(".")[0] != "zstandard":
                raise
    return total


def mix(session: Session, user: Principal, body) -> Dataset:
    for i, src in enumerate(body.sources):
        d = session.get(Dataset, src.dataset_id)
        if d is None:
            raise Invalid(f"sources[{i}].dataset_id: {src.dataset_id} not found",
                          param=f"sources.{i}.dataset_id", code="unknown_input")
        if d.status == "failed":
            raise Conflict(f"sources[{i}]: dataset {d.id} failed to ingest", code="dataset_failed",
                           param=f"sources.{i}.dataset_id")
    ds = _new(session, user, body.name, {"mix": [s.model_dump() for s in body.sources]}, None)
    job = create_job(session, user, JobCreate(
        type=JobType.mix, name=f"mix {body.name}",
        inputs={"sources": [s.model_dump(exclude_none=True) for s in body.sources]},
        params={"dedupe": body.dedupe, "seed": body.seed}))
    ds.job_id = job.id
    return ds


def on_job_status(session: Session, ev: StatusChanged) -> None:
    """Subscriber (app/wiring.py): the dataset row follows its ingest or mix job."""
    job = ev.job
    if job.type not in ("ingest", "mix"):
        return
    ds = session.scalar(select(Dataset).where(Dataset.job_id == job.id))
    if ds is None:
        return
    if job.status == S.succeeded and job.outputs:
        art = session.get(Artifact, job.outputs[0])
        assert art is not None, job.outputs  # recorded in the transaction that succeeded it
        m = art.meta or {}
        ds.status, ds.artifact_id = "ready", art.id
        ds.format = m.get("format", ds.format or ("mix" if job.type == "mix" else None))
        ds.num_records = m.get("num_records")
        ds.num_rejected = m.get("num_rejected", 0)
        ds.rejected_sample = m.get("rejected_sample", [])
        ds.stats = m.get("stats", {})
        ds.error = None
    elif job.status in (S.failed, S.cancelled):
        ds.status = "failed"
        ds.error = {k: v for k, v in (job.error or {}).items() if k in ("code", "message", "details")}
    elif job.status in WAITING:
        ds.status = "ingesting"


def list_datasets(session: Session, page: Page, *, status: str | None = None):
    stmt = select(Dataset)
    if status:
        stmt = stmt.where(Dataset.status == status)
    return paginate(session, stmt, Dataset.id, page)


def get_dataset(session: Session, ds_id: str) -> Dataset:
    d = session.get(Dataset, ds_id)
    if d is None:
        raise NotFound(f"dataset {ds_id} not found", param="id")
    return d


def delete_dataset(session: Session, user: Principal, d: Dataset) -> None:
    """The row goes (docs/API.md) and so do its files: the upload, and its artifact to a tombstone
    (app/storage/delete.py: lineage kept, files removed once this commits), unless another
    dataset shares that artifact (an identical ingest reused it). Same rule as an artifact's
    delete: 409 naming the live jobs that need it, its own ingest or mix among them."""
    may_delete(user, d.owner_id, d.id)
    lock(session)
    own = session.scalar(select(Job.id).where(Job.id == d.job_id,
                                              Job.status.notin_(TERMINAL)))
    if own:
        raise Conflict(f"dataset {d.id} is used by active jobs: {own} (the job that makes it)",
                       code="dataset_in_use", details={"jobs": [own]})
    arts = [d.artifact_id] if d.artifact_id else []
    refuse_if_needed(session, f"dataset {d.id}", arts, extra=[d.id], code="dataset_in_use")
    art = session.get(Artifact, d.artifact_id) if d.artifact_id else None
    shared = art is not None and session.scalar(select(Dataset.id).where(
        Dataset.artifact_id == art.id, Dataset.id != d.id).limit(1))
    if art is not None and not shared:
        tombstone(session, art, user.id)
    upload = get_settings().uploads_dir / d.id
    after_commit(session, lambda: shutil.rmtree(upload, ignore_errors=True))
    session.delete(d)

