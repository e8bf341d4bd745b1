"""Which field of the run body each plan check is about (a failed plan's 422 had
`param: null`, so a client could not point at the field to fix). Every check gets a `param`
as the run body spells it; the refusal's error names the first failing one."""

from __future__ import annotations

import re

from contracts.run import RunSpec

_FIXED = {
    "thinking_mode": "chat_template_kwargs.enable_thinking",
    "drafter_params": "drafter.draft_vocab_size",
    "records_render": "dataset_id",
    "lengths": "stages.prepare.seq_length",
    "disk": "stages.extract",
}


def check_param(check: dict, body: RunSpec) -> str:
    name, msg = check.get("name") or "", check.get("message") or ""
    # A check of one of several drafters ends in `:<name>` (workers/stages/plan.py).
    name, _, drafter = name.partition(":")
    if drafter and name in ("layer_ids", "drafter_params"):
        if name == "layer_ids" and (body.stages.extract or {}).get("layer_ids") is not None:
            return "stages.extract.layer_ids"
        field = "target_layer_ids" if name == "layer_ids" else "draft_vocab_size"
        return body.field_of(f"train:{drafter}", f".drafter.{field}")
    if name in _FIXED:
        return _FIXED[name]
    if name == "run":  # "<field>: <message>", the field as the run spells it
        return msg.split(":", 1)[0].strip() or "body"
    if name.endswith("_params"):  # "<job key>: params.<field>: <message>"
        key = name.removesuffix("_params") + (f":{drafter}" if drafter else "")
        m = re.match(rf"{re.escape(key)}: params(\.[\w.]+)", msg)
        return body.field_of(key, m.group(1) if m else "")
    if name == "layer_ids":
        if (body.stages.extract or {}).get("layer_ids") is not None:
            return "stages.extract.layer_ids"
        return "drafter.target_layer_ids"
    if name == "chat_template":
        own = [s for s in ("prepare", "generate", "evaluate")
               if (getattr(body.stages, s) or {}).get("chat_template")]
        return f"stages.{own[0]}.chat_template" if own else "target_id"
    return name or "body"


def name_params(plan: dict, body: RunSpec) -> dict:
    """`param` on every check that has none (checks added later name their own)."""
    for c in plan.get("checks") or []:
        if not c.get("param"):
            c["param"] = check_param(c, body)
    return plan
