"""Records a stage drops, in a form a user can read.

Counts by reason say how much went wrong; they do not say which records or why. Every stage
that drops records keeps, with one `FailureLog`: the counts, a sample of
`{"id", "line", "reason", "message"}` for the job (as ingest's `rejected_sample`), and the
full list as a JSONL file in the job's folder (`work_dir`, which outlives a failed attempt),
copied into the artifact on success. When the stage stops on its failure budget, the same
summary goes into the job's `error.details`.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

SAMPLE_SIZE = 20
MESSAGE_CHARS = 1000  # a template's traceback can be long; the file keeps the first part
SAMPLE_MESSAGE_CHARS = 300  # the sample travels in the job's row and error: keep it small


def source_line(source: str | None) -> int | None:
    """The input line of a record whose source is "<dataset name>:<line>", else None."""
    if not source or ":" not in source:
        return None
    tail = source.rsplit(":", 1)[1]
    return int(tail) if tail.isdigit() else None


class FailureLog:
    """Append-only list of dropped records: a JSONL file, counts by reason and a sample."""

    def __init__(self, path: Path | str, sample_size: int = SAMPLE_SIZE):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
        self.by_reason: Counter = Counter()
        self.sample: list[dict] = []
        self.sample_size = sample_size
        self._ids: set[str] = set()

    @property
    def count(self) -> int:
        return sum(self.by_reason.values())

    def add(self, rid: str, reason: str, message: str | None = None,
            source: str | None = None) -> None:
        if rid in self._ids:  # a resumed attempt may see a record of an earlier one again
            return
        self._ids.add(rid)
        text = (message or "")[:MESSAGE_CHARS]
        row = {"id": rid, "line": source_line(source), "source": source, "reason": reason,
               "message": text}
        self._fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._fh.flush()  # the file is what a user reads after a crash, too
        self.by_reason[reason] += 1
        if len(self.sample) < self.sample_size:
            self.sample.append({"id": rid, "line": row["line"], "reason": reason,
                                "message": text[:SAMPLE_MESSAGE_CHARS]})

    def summary(self, **extra: Any) -> dict:
        """What the job shows: counts, the sample and where the full list is."""
        return {"num_failed": self.count, "failed_by_reason": dict(self.by_reason.most_common()),
                "failed_sample": self.sample, "failures_file": str(self.path), **extra}

    def copy_to(self, folder: Path | str) -> Path:
        if not self._fh.closed:
            self._fh.flush()
        dest = Path(folder) / self.path.name
        shutil.copyfile(self.path, dest)
        return dest

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()
