"""Publishing a stage's artifacts: files only (the DB record of them is workers/runner.py's
`record_outcome`). Each declared folder is moved from the attempt's out_dir into
`artifacts/<kind>/<id>/` with one rename, so an artifact appears whole or not at all, and
gets a manifest (bytes, sha256 of small files, producer, inputs, params)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.ids import new_id


class ArtifactMissing(Exception):
    """The stage declared an artifact it did not write."""

    def __init__(self, path: str):
        super().__init__(f"the stage declared artifact {path!r} but did not write it")
        self.path = path


@dataclass(frozen=True)
class Published:
    id: str
    kind: str
    name: str | None
    uri: str
    bytes: int
    files: list[dict]
    meta: dict[str, Any]


def manifest(folder: Path) -> tuple[int, list[dict]]:
    total, files = 0, []
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            size = p.stat().st_size
            total += size
            entry: dict[str, Any] = {"path": str(p.relative_to(folder)), "bytes": size}
            if size <= 1 << 20:
                entry["sha256"] = hashlib.sha256(p.read_bytes()).hexdigest()
            files.append(entry)
    return total, files


def publish_artifacts(declared: list[dict], out_dir: Path, artifacts_dir: Path, *,
                      job_id: str, inputs: list[str], params: dict,
                      moved: list[tuple[Path, Path]] | None = None) -> list[Published]:
    """Move every declared artifact into place; nothing moves unless all of them exist.
    `moved` collects (source, destination) as each one moves, for `unpublish`."""
    for a in declared:
        if not (out_dir / a["path"]).exists():
            raise ArtifactMissing(a["path"])
    out = []
    for a in declared:
        art_id = new_id("art")
        dest = artifacts_dir / a["kind"] / art_id
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(out_dir / a["path"], dest)  # atomic: the artifact appears whole or not at all
        if moved is not None:
            moved.append((out_dir / a["path"], dest))
        size, files = manifest(dest)
        meta = {**(a.get("meta") or {}), "name": a.get("name")}
        if isinstance(meta.get("vllm_serve_command"), str):
            # The stage cannot know where its artifact will live; now we do.
            meta["vllm_serve_command"] = meta["vllm_serve_command"].replace(
                "<drafter_path>", str(dest))
        (dest / "manifest.json").write_text(json.dumps(
            {"id": art_id, "kind": a["kind"], "producer_job": job_id, "inputs": inputs,
             "params": params, "bytes": size, "files": files}, indent=1, default=str))
        out.append(Published(art_id, a["kind"], a.get("name"), str(dest), size, files, meta))
    return out


def unpublish(moved: list[tuple[Path, Path]]) -> None:
    """Put moved artifacts back where the stage wrote them (their DB record did not commit), so
    that a retry of the outcome finds them again."""
    for src, dest in reversed(moved):
        (dest / "manifest.json").unlink(missing_ok=True)
        os.replace(dest, src)
