"""The volumes draftyard writes to."""

from __future__ import annotations

from pathlib import Path

from app.core.config import get_settings


def existing(path: Path) -> Path:
    """statvfs needs an existing path; a folder may not exist yet."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def volumes() -> dict[str, Path]:
    """By name: artifacts (published) and scratch (jobs' work and output folders)."""
    s = get_settings()
    return {"artifacts": s.artifacts_dir, "scratch": s.jobs_dir}
