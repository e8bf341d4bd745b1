"""The evaluate stage's check that its data was made under the evaluation's chat template and
thinking mode (the params model is contracts/evaluate.py)."""

from __future__ import annotations

import json


def _generation_meta(meta: dict) -> tuple[dict | None, str | None]:
    """(chat_template_kwargs, chat_template_sha256) a producing stage recorded, if any."""
    for src in (meta, meta.get("generation") or {}, meta.get("prepare") or {}):
        if isinstance(src, dict) and ("chat_template_kwargs" in src
                                      or "chat_template_sha256" in src):
            return src.get("chat_template_kwargs"), src.get("chat_template_sha256")
    return None, None


def template_mismatch(data_meta: dict, kwargs: dict, sha: str | None) -> str | None:
    """Why the data's template/thinking mode differs from the evaluation's, or None.

    Mismatched thinking mode is the best-known cause of collapsed acceptance, so
    a drafter measured under another mode than it was trained for gets a misleading number.
    """
    data_kwargs, data_sha = _generation_meta(data_meta or {})
    problems = []
    if data_kwargs is not None and _norm(data_kwargs) != _norm(kwargs):
        problems.append(f"chat_template_kwargs: data {json.dumps(data_kwargs, sort_keys=True)}, "
                        f"evaluation {json.dumps(kwargs, sort_keys=True)}")
    if data_sha and sha and data_sha != sha:
        problems.append(f"chat template sha256: data {data_sha[:12]}…, evaluation {sha[:12]}…")
    return "; ".join(problems) or None


def _norm(d: dict) -> str:
    return json.dumps(d or {}, sort_keys=True)
