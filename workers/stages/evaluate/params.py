"""Typed params and inputs of the `evaluate` stage, validated before anything is loaded."""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workers.stages.common import StageError

Measure = Literal["tau_sim", "specdec", "vllm"]


class EvalParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # FIELD-NOTES demo: 32 held-out prompts x 96 new tokens separate trained from untrained.
    num_prompts: int = Field(32, ge=1, le=100_000)
    max_new_tokens: int = Field(96, ge=1, le=32_768)
    # Verify block = drafted tokens + 1; None = as the drafter was trained.
    block_size: int | None = Field(None, ge=2, le=64)
    # Override template text and kwargs (e.g. enable_thinking) for rendering dataset prompts.
    chat_template: str | None = None
    chat_template_kwargs: dict = Field(default_factory=dict)
    # tau below this -> verdict "reject" (the job still succeeds).
    min_tau: float | None = Field(None, ge=0.0)
    measures: list[Measure] = Field(default_factory=lambda: ["tau_sim", "specdec"], min_length=1)
    # "untrained": the same drafter config with fresh seeded weights, when no
    # baseline_drafter input is given. None: no baseline.
    baseline: Literal["untrained"] | None = "untrained"
    seed: int = 0
    allow_template_mismatch: bool = False
    # Teacher-forced rows for tau_sim (cheap: one target forward and a few drafter forwards).
    tau_sim_rows: int = Field(256, ge=1, le=100_000)
    # GPU boxes: extra `vllm serve` arguments and port for the "vllm" measure.
    vllm_args: list[str] = Field(default_factory=list)
    vllm_port: int = Field(8765, ge=1024, le=65535)


def parse_params(raw: dict | None) -> EvalParams:
    try:
        return EvalParams(**(raw or {}))
    except ValidationError as e:
        errs = e.errors()
        fields = ", ".join(".".join(str(x) for x in err["loc"]) or "params" for err in errs)
        msg = "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in errs)
        raise StageError("invalid_params", f"invalid evaluate params ({fields}): {msg}",
                         {"errors": [{"loc": list(err["loc"]), "msg": err["msg"]}
                                     for err in errs]}) from None


def require_input(inputs: dict, name: str, keys: tuple[str, ...] = ("path",)) -> dict:
    val = inputs.get(name)
    if not isinstance(val, dict):
        raise StageError("invalid_input", f"evaluate needs input {name!r}")
    for k in keys:
        if not val.get(k):
            raise StageError("invalid_input", f"input {name!r} lacks {k!r}")
    return val


def template_sha256(text: str | None) -> str | None:
    return hashlib.sha256(text.encode("utf-8")).hexdigest() if text else None


def _generation_meta(meta: dict) -> tuple[dict | None, str | None]:
    """(chat_template_kwargs, chat_template_sha256) a producing stage recorded, if any."""
    for src in (meta, meta.get("generation") or {}, meta.get("prepare") or {}):
        if isinstance(src, dict) and ("chat_template_kwargs" in src
                                      or "chat_template_sha256" in src):
            return src.get("chat_template_kwargs"), src.get("chat_template_sha256")
    return None, None


def template_mismatch(data_meta: dict, kwargs: dict, sha: str | None) -> str | None:
    """Why the data's template/thinking mode differs from the evaluation's, or None.

    Mismatched thinking mode is the best-known cause of collapsed acceptance (issue 5), so
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
