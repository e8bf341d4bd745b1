"""Job log files: `$DRAFTYARD_HOME/jobs/<id>/log.txt`, written by the supervisor."""

from __future__ import annotations

import asyncio

from pathlib import Path

from app.core.config import get_settings
from app.core.db import unit_of_work
from app.jobs.states import TERMINAL
from app.models import Job


def log_path(job_id: str) -> Path:
    return get_settings().jobs_dir / job_id / "log.txt"


def read_tail(job_id: str, tail: int | None, max_bytes: int = 4 << 20) -> str:
    p = log_path(job_id)
    if not p.exists():
        return ""
    size = p.stat().st_size
    with open(p, "rb") as fh:
        fh.seek(max(0, size - max_bytes))
        data = fh.read().decode("utf-8", "replace")
    if tail is None:
        return data
    lines = data.splitlines(keepends=True)
    return "".join(lines[-tail:])


async def follow(job_id: str, tail: int | None, request):
    first = read_tail(job_id, tail or 50)
    yield first
    p = log_path(job_id)
    pos = p.stat().st_size if p.exists() else 0
    while True:
        if p.exists() and p.stat().st_size > pos:
            with open(p, "rb") as fh:
                fh.seek(pos)
                chunk = fh.read()
            pos += len(chunk)
            yield chunk.decode("utf-8", "replace")
            continue

        def finished() -> bool:
            with unit_of_work(read_only=True) as s:
                j = s.get(Job, job_id)
                return j is None or j.status in TERMINAL
        if await asyncio.to_thread(finished):
            if p.exists() and p.stat().st_size > pos:
                continue
            return
        if await request.is_disconnected():
            return
        await asyncio.sleep(0.3)

