"""Several drafters of one run, side by side (contracts/run.py `drafters`): they trained on
the same prepared data and were evaluated on the same data with the same decoding loop, so
their tau, acceptance per position, training time and size compare. `GET /v1/runs/{id}/report`
carries the ranking as `drafters` (best first); `draftyard runs show` and the dashboard's run
page render it (docs/compare-drafters.md)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from app.models import Job
from app.runs.service import ranked

# A safetensors header longer than this is no checkpoint of ours (the format allows 100 MB).
MAX_HEADER_BYTES = 100 << 20


def drafter_jobs(js: list[Job]) -> dict[str | None, tuple[Job | None, Job | None]]:
    """(train, evaluate) per drafter name: the keys `train:<name>`/`evaluate:<name>` of a run
    of several drafters, or None -> the one drafter's `train`/`evaluate`."""
    out: dict[str | None, list[Job | None]] = {}
    for j in js:
        stage, _, name = str(j.run_stage or "").partition(":")
        if stage in ("train", "evaluate"):
            pair = out.setdefault(name or None, [None, None])
            pair[stage == "evaluate"] = j
    return {k: (v[0], v[1]) for k, v in out.items()}


def wall_seconds(job: Job | None) -> float | None:
    """How long a job's last attempt ran (a reused job: none of its own)."""
    if job is None or job.started_at is None or job.finished_at is None:
        return None
    return round((job.finished_at - job.started_at).total_seconds(), 1)


def stored_parameters(folder: str | None) -> int | None:
    """Parameters stored in a checkpoint folder's safetensors files, read from their headers
    (8 bytes of header length, then JSON: name -> dtype, shape); None when none is readable."""
    total, seen = 0, False
    for f in sorted(Path(folder).glob("*.safetensors")) if folder else []:
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if n > MAX_HEADER_BYTES:
                    continue
                header = json.loads(fh.read(n))
        except (OSError, ValueError, struct.error):
            continue
        for name, t in header.items():
            if name != "__metadata__" and isinstance(t, dict):
                total += math.prod(int(d) for d in t.get("shape") or [])
                seen = True
    return total if seen else None


def compare(pairs: dict[str | None, tuple[Job | None, Job | None]],
            views: dict[str | None, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per drafter, ranked by tau on the shared evaluation (best first; a drafter
    not evaluated yet last)."""
    rows = []
    for name, (tr, ev) in pairs.items():
        view = views[name]
        e, d = view["evaluation"], view["drafter"] or {}
        cfg = ((tr.params or {}).get("drafter") or {}) if tr else {}
        rows.append({
            "name": name, "type": cfg.get("type"),
            "options": {k: v for k, v in cfg.items() if k not in ("type", "target_layer_ids")},
            "tau": e.get("tau"), "tau_baseline": e.get("tau_baseline"),
            "tau_prompt_lookup": e.get("tau_prompt_lookup"), "tau_sim": e.get("tau_sim"),
            "verdict": e.get("verdict"), "verdict_reason": e.get("verdict_reason"),
            "acceptance_per_position": view["per_position"].get("trained"),
            "train_seconds": wall_seconds(tr), "train_reused_from": tr.reused_from if tr else None,
            "steps": d.get("steps"), "final_loss": d.get("final_loss"),
            "drafter_bytes": d.get("bytes"), "drafter_parameters": d.get("parameters"),
            "drafter_artifact_id": d.get("artifact_id"), "serve_command": d.get("serve_command"),
            "train_job_id": tr.id if tr else None, "evaluate_job_id": ev.id if ev else None,
            "status": {"train": tr.status if tr else None, "evaluate": ev.status if ev else None},
        })
    return [{"rank": i + 1, **r} for i, r in enumerate(ranked(rows, "name"))]
