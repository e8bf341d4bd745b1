"""A dataset's rejects, a page at a time (thousands of rejects on an 800K ingest).

The rejects live in the dataset artifact's `rejects.jsonl` (one `{"line", "reason"}` per
rejected input record, in input order). A page reads only its own lines: the cursor
(`next_after`) is the byte offset where the next page starts, so the cost of a page does not
grow with the file or with how far the reader has paged."""

from __future__ import annotations

from pathlib import Path

import orjson
from sqlalchemy.orm import Session

from app.core.errors import Invalid
from app.core.pagination import list_body
from app.models import Artifact, Dataset

REJECTS_FILE = "rejects.jsonl"


def _bad(after: str) -> Invalid:
    return Invalid(f"after: {after!r} is not a cursor of this dataset's rejects (use the "
                   "next_after of the previous page)", param="after", code="invalid_value")


def _cursor(after: str | None, f) -> int:
    """The offset `after` names, checked to start a line of this file."""
    if after is None:
        return 0
    if not after.isdigit() or len(after) > 18:
        raise _bad(after)
    pos = int(after)
    if pos:
        f.seek(pos - 1)
        if f.read(1) != b"\n":
            raise _bad(after)
    return pos


def rejects_page(session: Session, d: Dataset, limit: int, after: str | None) -> dict:
    a = session.get(Artifact, d.artifact_id) if d.artifact_id else None
    path = Path(a.uri) / REJECTS_FILE if a is not None and a.deleted_at is None else None
    if path is None or not path.is_file():
        if after is not None and after != "0":
            raise _bad(after)
        return list_body([], False, None)
    out: list[dict] = []
    with open(path, "rb") as f:
        f.seek(_cursor(after, f))
        while len(out) < limit:
            line = f.readline()
            if not line:
                break
            if line.strip():
                out.append(orjson.loads(line))
        pos = f.tell()
        more = any(x.strip() for x in iter(f.readline, b""))
    return list_body(out, more, str(pos) if more else None)
