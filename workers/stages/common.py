"""The contract between a stage and whoever runs it (the supervisor, a test, a shell).

A stage is `run(params, inputs, ctx: StageContext) -> dict` in `workers/stages/<type>.py` (or a
package of that name), called by the entry point (workers/stages/entry.py) with its params
and resolved inputs typed (contracts/jobtypes.py, contracts/resolved.py). It reads only the
paths in its spec and writes only under
`spec["out_dir"]` (artifacts, renamed into place by the supervisor on success) and
`spec["work_dir"]` (state that survives a retry, on the shared folder so that a retry on
another node finds it: checkpoints, finished shards). `spec["scratch_dir"]` (with TMPDIR) is
node-local and goes with the attempt: what no retry needs (a hand-off file, a server log).

It reports through `ctx`, which appends one JSON object per line to `spec["events_path"]`:

    {"kind": "progress", "data": {"stage", "done", "total", "unit", "phase"?, ...}}
    {"kind": "metric",   "data": {"step": int, "<name>": float, ...}}
    {"kind": "warning",  "data": {"message", ...}}
    {"kind": "artifact", "data": {"name", "kind", "path" (relative to out_dir), "meta"}}
    {"kind": "result",   "data": {...summary...}}
    {"kind": "error",    "data": {"code", "message", "details"}}

A typed failure raises `StageError(code, message)`; the runner turns it into an `error` event
and exit status 2; bad params and inputs take one shape in every stage (`kernel.py`).
Anything else is a crash (exit 1) and the supervisor reports the log tail.

This module imports nothing heavy and nothing from app/, SQLAlchemy, Celery or HTTP.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any



class StageError(Exception):
    """A failure with a stable code that the user can act on (bad input, planner refusal)."""

    def __init__(self, code: str, message: str, details: Any = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


@dataclass
class StageContext:
    """Event sink for one stage run. Safe to use without a supervisor (events go to a file)."""

    events_path: Path | None
    out_dir: Path
    work_dir: Path
    min_progress_interval_s: float = 0.25
    _last_progress: float = field(default=0.0, repr=False)
    _fh: Any = field(default=None, repr=False)
    artifacts: list[dict] = field(default_factory=list)
    # The job this attempt runs (None: a stage run alone), and the server limits it holds its
    # inputs to (contracts/spec.StageSpec `limits`).
    job_id: str | None = None
    limits: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_spec(cls, spec: dict) -> "StageContext":
        out_dir = Path(spec.get("out_dir") or Path(spec.get("work_dir", ".")) / "out")
        work_dir = Path(spec.get("work_dir") or out_dir.parent / "work")
        out_dir.mkdir(parents=True, exist_ok=True)
        work_dir.mkdir(parents=True, exist_ok=True)
        ev = spec.get("events_path")
        return cls(events_path=Path(ev) if ev else None, out_dir=out_dir, work_dir=work_dir,
                   job_id=spec.get("job_id"), limits=dict(spec.get("limits") or {}))

    def emit(self, kind: str, data: dict) -> None:
        if self.events_path is None:
            return
        if self._fh is None:
            self.events_path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.events_path, "a", encoding="utf-8")  # noqa: SIM115
        self._fh.write(json.dumps({"kind": kind, "at": time.time(), "data": data}) + "\n")
        self._fh.flush()

    def progress(self, done: int, total: int | None, unit: str, stage: str | None = None,
                 force: bool = False, **extra: Any) -> None:
        """Report progress; throttled so a tight loop can call it on every item. `extra`:
        more fields of the job's `progress` (a stage's phase: `phase`, `phase_index`,
        `phases`)."""
        now = time.monotonic()
        final = total is not None and done >= total
        if not (force or final) and now - self._last_progress < self.min_progress_interval_s:
            return
        self._last_progress = now
        self.emit("progress", {"stage": stage, "done": done, "total": total, "unit": unit,
                               **extra})

    def metric(self, step: int, **values: float) -> None:
        self.emit("metric", {"step": int(step), **{k: float(v) for k, v in values.items()}})

    def warning(self, message: str, **data: Any) -> None:
        self.emit("warning", {"message": message, **data})

    def artifact(self, name: str, kind: str, path: Path | str, meta: dict | None = None) -> None:
        """Declare a finished artifact folder under out_dir (kind: dataset, tokenized, ...)."""
        p = Path(path)
        rel = p.relative_to(self.out_dir) if p.is_absolute() else p
        rec = {"name": name, "kind": kind, "path": str(rel), "meta": meta or {}}
        self.artifacts.append(rec)
        self.emit("artifact", rec)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def template_sha256(text: str) -> str:
    """The identity of a chat-template text, one definition for every stage: generate records
    it in its dataset, prepare and evaluate compare theirs against it."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def atomic_write(path: Path | str, write: Callable[[Path], Any], fsync: bool = False) -> Path:
    """Create `path` whole or not at all: `write(tmp)` fills `.<name>.tmp<pid>.<thread>` beside
    it, which is renamed over `path`, so a reader (or a resumed attempt) never sees half a
    file; a kill leaves only the dot-prefixed temp file. `fsync` before the rename when a
    machine crash must not leave a renamed but empty file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{threading.get_ident()}")
    try:
        write(tmp)
        if fsync:
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON so a reader never sees half a file (tmp + fsync + rename)."""
    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, indent=1, ensure_ascii=False)

    atomic_write(path, write, fsync=True)


def check_roots(inputs: Any, roots: dict[str, list[str]] | None) -> None:
    """Defence in depth: the API checked every path a client named; the stage entry point
    (workers/stages/entry.py) checks the paths of the typed inputs again against the roots
    the spec carries (`{"data": [...], "model": [...], "artifacts": [...]}`, written by the
    worker), so a path that slipped past the API (or a spec edited on disk) is still not
    opened. A spec without `roots` is one an operator wrote to run a stage alone from a
    shell."""
    if roots is None:
        return
    from contracts.inputs import SourceFile
    from contracts.resolved import ResolvedArtifact, ResolvedTarget
    from contracts.roots import within_roots

    def check(raw: Any, which: tuple[str, ...], where: str) -> None:
        if raw is None:
            return
        allowed = [r for w in which for r in roots.get(w) or []]
        if within_roots(str(raw), allowed) is None:
            raise StageError("path_not_allowed", f"{where}: the path is outside the folders "
                             "this server may read", {"param": where})

    for name in type(inputs).model_fields:
        value = getattr(inputs, name)
        for i, v in enumerate(value if isinstance(value, list) else [value]):
            where = f"inputs.{name}" + (f".{i}" if isinstance(value, list) else "")
            if isinstance(v, SourceFile):
                check(v.path, ("data",), where + ".path")
            elif isinstance(v, ResolvedTarget):
                check(v.path, ("model",), where + ".path")
                check(v.tokenizer_path, ("model",), where + ".tokenizer_path")
            elif isinstance(v, ResolvedArtifact):
                check(v.path, ("artifacts",), where + ".path")


def read_spec(path: str | Path) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)
