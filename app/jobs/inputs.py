"""Resolve a job's input references (ids and `{"job": ...}`) to concrete artifacts and targets:
the typed models of contracts/resolved.py, built here and nowhere else.

Used by the scheduler (reuse fingerprints, disk reservations), the API's plan and the worker
(the stage's spec, whose entry point validates them again: workers/stages/entry.py)."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from sqlalchemy.orm import Session

from app.jobs.states import JobStatus as S
from app.models import Artifact, Dataset, Job, Target
from contracts.jobtypes import JOB_TYPES
from contracts.resolved import Resolved, ResolvedArtifact, ResolvedDataset, ResolvedTarget


class Unresolved(Exception):
    """An input is not available (yet, or any more)."""


class InputDeleted(Unresolved):
    """An input artifact was deleted (a tombstone, app/storage/delete.py): waiting will not
    bring it back, so the job fails naming it."""


def live(a: Artifact, via: str = "") -> Artifact:
    if a.deleted_at is not None:
        by = "retention" if a.deleted_by == "retention" else f"user {a.deleted_by}"
        raise InputDeleted(f"{via}artifact {a.id} ({a.kind}) was deleted by {by} at "
                           f"{a.deleted_at.isoformat()}; its files are gone: rerun the job "
                           f"that made it (force) or pick another input")
    return a


def resolved_target(t: Target) -> ResolvedTarget:
    return ResolvedTarget(id=t.id, path=t.path, tokenizer_path=t.tokenizer_path,
                          chat_template=t.chat_template,
                          chat_template_kwargs=t.chat_template_kwargs or {},
                          config=t.config or {})


def resolved_artifact(a: Artifact, **dataset: Any) -> ResolvedArtifact:
    return ResolvedArtifact(kind=a.kind, id=a.id, path=a.uri, meta=a.meta or {}, **dataset)


def resolve_ref(session: Session, ref: Any, kinds: tuple[str, ...]) -> Resolved:
    if isinstance(ref, dict) and "dataset_id" in ref:  # a mix source carries its own options
        base = resolve_ref(session, ref["dataset_id"], kinds)
        return ResolvedDataset(**{**base.model_dump(), **ref})
    if isinstance(ref, dict) and "artifact" in ref:
        ref = ref["artifact"]
    if isinstance(ref, str) and ref.startswith("job_"):
        ref = {"job": ref}
    if isinstance(ref, dict) and "job" in ref:
        job = session.get(Job, ref["job"])
        if job is None or job.status != S.succeeded:
            raise Unresolved(f"job {ref['job']} has not succeeded")
        arts = [a for a in (session.get(Artifact, x) for x in job.outputs) if a is not None]
        want = ref.get("output")
        for art in arts:
            if (want and art.meta.get("name") == want) or (not want and art.kind in kinds):
                return resolved_artifact(live(art, f"job {job.id}'s output "))
        raise Unresolved(f"job {job.id} produced no {'/'.join(kinds)} artifact")
    if isinstance(ref, str) and ref.startswith("tgt_"):
        t = session.get(Target, ref)
        if t is None:
            raise Unresolved(f"target {ref} not found")
        return resolved_target(t)
    if isinstance(ref, str) and ref.startswith("ds_"):
        d = session.get(Dataset, ref)
        if d is None or d.artifact_id is None:
            raise Unresolved(f"dataset {ref} is not ready")
        a = session.get(Artifact, d.artifact_id)
        if a is None:
            raise Unresolved(f"dataset {ref}: its artifact {d.artifact_id} is gone")
        return resolved_artifact(live(a, f"dataset {ref}: its "), dataset_id=d.id, name=d.name)
    if isinstance(ref, str) and ref.startswith("art_"):
        a = session.get(Artifact, ref)
        if a is None:
            raise Unresolved(f"artifact {ref} not found")
        return resolved_artifact(live(a))
    raise Unresolved(f"cannot resolve input {ref!r}")


def resolve(session: Session, job: Job) -> dict[str, Any]:
    """{input name: its resolved model (a list for a list input)}; an ingest's source file as
    the client named it (its stage validates it: contracts/resolved.IngestResolved)."""
    allowed = JOB_TYPES[job.type].accepts
    out: dict[str, Any] = {}
    for name, ref in (job.inputs or {}).items():
        if job.type == "ingest":
            out[name] = ref  # the file as the client named it (contracts/inputs.SourceFile)
            continue
        kinds = allowed.get(name, ())
        out[name] = ([resolve_ref(session, r, kinds) for r in ref] if isinstance(ref, list)
                     else resolve_ref(session, ref, kinds))
    return out


def fingerprint(job: Job, resolved: dict[str, Any]) -> str:
    """type + input artifact ids + params + stage version (docs/ARCHITECTURE.md "Storage")."""

    def ident(v: Any) -> Any:
        if isinstance(v, list):
            return [ident(x) for x in v]
        if isinstance(v, ResolvedTarget):  # a target is its files and its template
            return {"id": v.id, "path": v.path, "tmpl": v.chat_template,
                    "kw": v.chat_template_kwargs}
        if isinstance(v, ResolvedDataset):
            return {"id": v.id, **v.model_dump(include={"weight", "max_records"},
                                               exclude_none=True)}
        if isinstance(v, ResolvedArtifact):
            return {"id": v.id}
        return v

    body = {"type": job.type, "inputs": {k: ident(v) for k, v in resolved.items()},
            "params": job.params, "version": JOB_TYPES[job.type].version}
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
